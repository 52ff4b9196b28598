"""``loopd serve``'s start with ``[[endpoint]]`` tables: every endpoint self-tested at once, the
ones down named with one line each, and loopd refusing to start only when none is up."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.config import load_settings
from loopd.serve import startup_endpoints
from loopd_dev import devserver

pytestmark = pytest.mark.anyio


def _tables(**urls: str) -> list[dict[str, object]]:
    return [
        {"name": name, "url": url, "model": devserver.PLAIN_MODEL, "slots": (0, 1)}
        for name, url in urls.items()
    ]


async def test_with_no_endpoint_up_loopd_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(
        endpoint=_tables(a=f"unix:{tmp_path}/a.sock", b=f"unix:{tmp_path}/b.sock"),
        state_dir=tmp_path,
    )
    status, checks = await startup_endpoints(settings)
    err = capsys.readouterr().err
    assert status == 2
    assert sorted(checks.down) == ["a", "b"]
    assert "loopd serve: refusing to start: no endpoint passed its self-test" in err
    assert "Traceback" not in err


@pytest.mark.real_server
async def test_one_endpoint_down_the_other_serves(
    real_server: devserver.RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(
        endpoint=_tables(a=real_server.url, b=f"unix:{tmp_path}/gone.sock"), state_dir=tmp_path
    )
    status, checks = await startup_endpoints(settings)
    down = checks.down
    assert status == 0, capsys.readouterr().err
    assert list(down) == ["b"]
    assert down["b"].startswith("unreachable"), down
