"""The metrics address: a Unix socket or a loopback port, and one clear line for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopcommon.address import TcpAddress, UnixAddress, check_address, parse_address
from loopcommon.errors import ConfigError
from loopd.config import load_settings


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("unix:/var/lib/loopd/metrics.sock", UnixAddress(Path("/var/lib/loopd/metrics.sock"))),
        ("127.0.0.1:9464", TcpAddress("127.0.0.1", 9464)),
        ("localhost:9464", TcpAddress("127.0.0.1", 9464)),
        ("[::1]:9464", TcpAddress("::1", 9464)),
        (" 127.0.0.2:1 ", TcpAddress("127.0.0.2", 1)),
    ],
)
def test_good_addresses(text: str, parsed: UnixAddress | TcpAddress) -> None:
    assert parse_address(text) == parsed
    assert parse_address(str(parsed)) == parsed  # the canonical form reads back the same


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0.0.0.0:9464", "not a loopback address"),
        ("192.168.1.5:9464", "not a loopback address"),
        ("example.org:9464", "not a loopback address"),
        ("127.0.0.1:0", "not a port number"),
        ("127.0.0.1:70000", "not a port number"),
        ("127.0.0.1:http", "not a port number"),
        ("unix:metrics.sock", "absolute socket path"),
        ("unix:/" + "x" * 120, "too long"),
        ("9464", "must be unix:/path/to.sock or 127.0.0.1:PORT"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_address(text)


def test_unset_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPD_METRICS_ADDR", raising=False)
    monkeypatch.delenv("LOOPD_CONFIG", raising=False)
    assert check_address(None) is None
    assert check_address("  ") is None
    assert load_settings().metrics_addr is None


def test_a_bad_loopd_setting_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOPD_METRICS_ADDR", "0.0.0.0:9464")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "METRICS_ADDR" in message.upper()
    assert "not a loopback address" in message
    assert "\n" not in message
