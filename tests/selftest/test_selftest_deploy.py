"""The deployment files: the example configs load, and the box is locked down as documented."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brokerd.config import load_settings as load_brokerd_settings
from loopd.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in os.environ:
        if name.startswith(("LOOPD_", "BROKERD_")):
            monkeypatch.delenv(name)
    return monkeypatch


def unit_file(name: str) -> dict[str, dict[str, list[str]]]:
    """A systemd/quadlet file as section -> key -> every value (keys such as Volume= repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (DEPLOY / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        else:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_the_example_loopd_config_loads(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOOPD_CONFIG", str(DEPLOY / "loopd.toml"))
    settings = load_settings()
    assert settings.infer_url == "unix:/run/loopd/infer.sock"
    assert settings.broker_url == "unix:/run/loopd/broker.sock"
    assert settings.slots == (0, 1)
    assert settings.state_dir == Path("/var/lib/loopd")


def test_the_example_brokerd_config_loads(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("BROKERD_CONFIG", str(DEPLOY / "brokerd.toml"))
    settings = load_brokerd_settings()
    assert settings.broker is not None
    assert settings.inference_url.startswith("http://127.0.0.1")


def test_the_loopd_container_has_no_network_and_a_read_only_root() -> None:
    container = unit_file("loopd.container")["Container"]
    assert container["Network"] == ["none"]
    assert container["ReadOnly"] == ["true"]
    assert container["DropCapability"] == ["all"]
    volumes = container["Volume"]
    targets = sorted(v.split(":")[1] for v in volumes)
    assert targets == [
        "/etc/loopd/expected",
        "/etc/loopd/loopd.toml",
        "/run/loopd",
        "/run/loopd-metrics",
        "/var/lib/loopd",
        "/workspace",
    ]
    assert "%t/brokerd:/run/loopd:ro" in volumes
    unit = unit_file("loopd.container")["Unit"]
    assert unit["Requires"] == ["brokerd.service"]


def test_the_brokerd_unit_serves_the_folder_the_container_mounts() -> None:
    service = unit_file("brokerd.service")["Service"]
    assert "BROKERD_SOCKET_DIR=%t/brokerd" in service["Environment"]
    assert service["ExecStart"][0].endswith("brokerd serve")


def test_the_image_points_loopd_at_the_mounted_sockets() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert "LOOPD_INFER_URL=unix:/run/loopd/infer.sock" in text
    assert 'ENTRYPOINT ["loopd"]' in text
    assert "USER loopd" in text
