"""The end-to-end stack, started once per test session and shared by the e2e tests.

- the real llama-server (router, ``smollm2``) on a loopback TCP port, as in production;
- the fake Mattermost on a Unix socket, knowing the bot token;
- ``brokerd serve`` (all three sockets) in front of both, the one the sandboxed loopd uses;
- a second ``brokerd serve --only infer`` whose upstream is a recording TCP tap in front of the
  same server, for the tests that must see what reaches the server and when.

Socket paths must stay under about 100 bytes, so everything lives in a short folder in /tmp.
"""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd_dev import devserver
from tests.e2e.e2e_support import REPO_ROOT, Brokerd, Child, ChildFailed, TcpTap, minimal_env

STARTUP_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def e2e_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="e2e", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def llama_tcp(e2e_dir: Path) -> Iterator[devserver.RunningServer]:
    """The real router on 127.0.0.1:<free port>, with ``smollm2`` loaded."""
    cache_dir = devserver.default_cache_dir()
    try:
        server = devserver.start(
            e2e_dir / "llama", cache_dir, port=devserver.free_port(), load=(devserver.PLAIN_MODEL,)
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server is required and could not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def bot_token() -> str:
    return "e2e-bot-" + secrets.token_hex(16)


@pytest.fixture(scope="session")
def mattermost(e2e_dir: Path, bot_token: str) -> Iterator[Path]:
    """The fake Mattermost on a Unix socket; its socket path."""
    uds = e2e_dir / "mm.sock"
    argv = [sys.executable, "-m", "loopd_dev.fakes.mattermost", "--uds", str(uds)]
    argv += ["--bot-token", bot_token]
    child = Child.start("fake mattermost", argv, e2e_dir / "mattermost.log", _env(e2e_dir))
    try:
        child.wait_for('"uds"', STARTUP_TIMEOUT_S)
        yield uds
    except ChildFailed as exc:
        pytest.fail(str(exc))
    finally:
        child.stop()


@pytest.fixture(scope="session")
def brokerd(
    e2e_dir: Path, llama_tcp: devserver.RunningServer, mattermost: Path, bot_token: str
) -> Iterator[Brokerd]:
    """brokerd with infer.sock, chat.sock and broker.sock, straight to the real server."""
    token_file = e2e_dir / "bot-token"
    token_file.write_text(bot_token + "\n")
    token_file.chmod(0o600)
    variables = {
        "BROKERD_SOCKET_DIR": str(e2e_dir / "run"),
        "BROKERD_INFERENCE_URL": llama_tcp.url,
        "BROKERD_MATTERMOST_URL": f"unix:{mattermost}",
        "BROKERD_MATTERMOST_TOKEN_FILE": str(token_file),
        "BROKERD_BROKER__AUDIT_DB": str(e2e_dir / "audit.db"),
    }
    yield from _brokerd(e2e_dir, "brokerd", variables, ())


@pytest.fixture(scope="session")
def tap(llama_tcp: devserver.RunningServer) -> Iterator[TcpTap]:
    host, _, port = llama_tcp.url.removeprefix("http://").partition(":")
    relay = TcpTap((host, int(port)))
    yield relay
    relay.close()


@pytest.fixture(scope="session")
def tapped_brokerd(e2e_dir: Path, tap: TcpTap) -> Iterator[Brokerd]:
    """brokerd's inference proxy alone, whose upstream is the tap in front of the real server."""
    variables = {"BROKERD_SOCKET_DIR": str(e2e_dir / "tapped"), "BROKERD_INFERENCE_URL": tap.url}
    yield from _brokerd(e2e_dir, "brokerd-tapped", variables, ("--only", "infer"))


def _brokerd(
    e2e_dir: Path, name: str, variables: dict[str, str], extra: tuple[str, ...]
) -> Iterator[Brokerd]:
    argv = [sys.executable, "-m", "brokerd", "serve", *extra]
    child = Child.start(name, argv, e2e_dir / f"{name}.log", _env(e2e_dir, **variables))
    try:
        child.wait_for('"msg": "ready: ', STARTUP_TIMEOUT_S)
        yield Brokerd(Path(variables["BROKERD_SOCKET_DIR"]), child)
    except ChildFailed as exc:
        pytest.fail(str(exc))
    finally:
        child.stop()


def _env(e2e_dir: Path, **variables: str) -> dict[str, str]:
    home = e2e_dir / "home"
    home.mkdir(exist_ok=True)
    return minimal_env(home, PYTHONPATH=str(REPO_ROOT), **variables)
