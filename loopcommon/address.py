"""Where a metrics page is served: ``unix:/path/to.sock`` or a loopback ``127.0.0.1:PORT``.

Pure parsing, shared by loopd (``LOOPD_METRICS_ADDR``) and brokerd (``metrics_addr``). Only
loopback addresses are accepted for TCP: the pages say what every session is doing, and loopd's
box has no network anyway, so a wildcard or outside address would only ever be a mistake.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

UNIX_PREFIX = "unix:"


@dataclass(frozen=True)
class UnixAddress:
    path: Path

    def __str__(self) -> str:
        return f"{UNIX_PREFIX}{self.path}"


@dataclass(frozen=True)
class TcpAddress:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


Address = UnixAddress | TcpAddress


def parse_address(text: str) -> Address:
    """``unix:/absolute/path`` or ``127.0.0.1:PORT`` (any loopback, ``[::1]:PORT`` too);
    ``ValueError`` saying what is wrong otherwise."""
    text = text.strip()
    if text.startswith(UNIX_PREFIX):
        path = text[len(UNIX_PREFIX) :]
        if not path.startswith("/"):
            raise ValueError("a unix: address needs an absolute socket path, e.g. unix:/run/m.sock")
        if len(path.encode()) > 100:  # sun_path holds 108 bytes; leave room for the NUL
            raise ValueError(f"the socket path is too long for a Unix socket ({len(path)} bytes)")
        return UnixAddress(Path(path))
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError("must be unix:/path/to.sock or 127.0.0.1:PORT")
    host = host.removeprefix("[").removesuffix("]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{host} is not a loopback address; use 127.0.0.1:PORT or unix:/path")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{port_text!r} is not a port number (1-65535)")
    return TcpAddress("127.0.0.1" if host == "localhost" else host, int(port_text))


def check_address(value: str | None) -> str | None:
    """A settings validator: the address as given (None stays None: off)."""
    if value is None or not value.strip():
        return None
    return str(parse_address(value))
