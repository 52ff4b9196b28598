"""brokerd serve: socket folder and modes, stale sockets, clean stop on SIGTERM, CLI errors."""

import os
import signal
import socket
import stat
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskStatus

from brokerd.cli import main
from brokerd.config import BrokerdSettings, InferenceEndpoint, Secrets
from brokerd.errors import ServeError
from brokerd.observe.middleware import Instrumented
from brokerd.serve import Endpoint, bind_unix_socket, build_endpoints, own_paths, serve
from brokerd.tools.settings import BrokerSettings
from tests.brokerd.proxy.proxy_support import raw_request

pytestmark = pytest.mark.anyio


def make_stale_socket(path: Path) -> None:
    """What a killed brokerd leaves: a socket file nobody listens on."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def test_a_stale_socket_is_replaced_and_anything_else_is_refused(sock_dir: Path) -> None:
    stale = sock_dir / "infer.sock"
    make_stale_socket(stale)
    bind_unix_socket(stale).close()
    assert stat.S_IMODE(stale.stat().st_mode) == 0o660
    regular = sock_dir / "chat.sock"
    regular.write_text("not a socket")
    with pytest.raises(ServeError, match="not a socket"):
        bind_unix_socket(regular)
    assert regular.read_text() == "not a socket"


def test_a_bound_socket_takes_connections_before_serving_starts(sock_dir: Path) -> None:
    """A start script that waits for the socket file may connect as soon as it appears."""
    path = sock_dir / "infer.sock"
    with bind_unix_socket(path) as listening, socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))  # queued, not refused
        accepted, _ = listening.accept()
        accepted.close()


@pytest.fixture
def brokerd_environment(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("BROKERD_"):
            monkeypatch.delenv(name)
    run_dir = sock_dir / "run"
    monkeypatch.setenv("BROKERD_SOCKET_DIR", str(run_dir))
    monkeypatch.setenv("BROKERD_INFERENCE_URL", f"unix:{sock_dir}/llama.sock")
    return run_dir


async def test_serve_makes_private_sockets_and_stops_cleanly_on_sigterm(
    brokerd_environment: Path,
) -> None:
    run_dir = brokerd_environment
    run_dir.mkdir()
    make_stale_socket(run_dir / "infer.sock")
    command = [sys.executable, "-m", "brokerd", "serve", "--only", "infer"]
    async with await anyio.open_process(command) as process:
        assert process.stderr is not None
        logged = b""
        with anyio.fail_after(20):
            while b"ready: " not in logged:
                logged += await process.stderr.receive()
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o750
        sock_mode = (run_dir / "infer.sock").stat().st_mode
        assert stat.S_ISSOCK(sock_mode)
        assert stat.S_IMODE(sock_mode) == 0o660
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            returncode = await process.wait()
    assert returncode == 0
    assert not (run_dir / "infer.sock").exists()
    assert b'"level": "info"' in logged  # JSON lines: stderr is not a terminal


@pytest.mark.usefixtures("restored_logging")
def test_serving_chat_without_mattermost_config_is_one_clear_line(
    brokerd_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--only", "chat"]) == 2
    err = capsys.readouterr().err
    assert err == "brokerd: BROKERD_MATTERMOST_URL: required to serve chat.sock\n"


@pytest.mark.usefixtures("restored_logging")
def test_a_socket_path_taken_by_a_file_is_one_clear_line(
    brokerd_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brokerd_environment.mkdir()
    (brokerd_environment / "infer.sock").write_text("mine")
    assert main(["serve", "--only", "infer"]) == 1
    assert capsys.readouterr().err.endswith("exists and is not a socket; not removing it\n")


async def test_all_three_sockets_are_served_from_one_process(sock_dir: Path) -> None:
    settings = BrokerdSettings(
        socket_dir=sock_dir / "run",
        inference_url=f"unix:{sock_dir}/no-llama.sock",
        mattermost_url=f"unix:{sock_dir}/no-mattermost.sock",
        broker=BrokerSettings(audit_db=sock_dir / "audit.db"),
    )
    endpoints = build_endpoints(settings, Secrets(inference_key=None, bot_token="t"))
    assert [endpoint.path.name for endpoint in endpoints] == [
        "infer.sock",
        "chat.sock",
        "broker.sock",
    ]
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_briefly, endpoints, settings.socket_dir, stop)
        sockets = {endpoint.name: endpoint.path for endpoint in endpoints}
        infer = await raw_request(sockets["infer"], "GET", "/health")
        chat = await raw_request(sockets["chat"], "GET", "/api/v4/users/me")
        broker = await raw_request(sockets["broker"], "GET", "/v1/health")
        stop.set()
    # No llama-server or Mattermost behind the proxies: each answers 502 in its own envelope.
    assert (infer.status, chat.status, broker.status) == (502, 502, 200)
    assert "error" in str(infer.json())
    assert "status_code" in str(chat.json())
    assert not any(endpoint.path.exists() for endpoint in endpoints)


def test_each_endpoint_table_is_one_inference_socket_and_its_key_is_hidden(
    sock_dir: Path,
) -> None:
    servers = (
        InferenceEndpoint(name="gpu1", url="http://gpu1:8080", key_file=sock_dir / "gpu1.key"),
        InferenceEndpoint(name="gpu2", url=f"unix:{sock_dir}/gpu2.sock"),
    )
    settings = BrokerdSettings(socket_dir=sock_dir / "run", endpoint=servers)
    secrets = Secrets(inference_key=None, bot_token=None, endpoint_keys={"gpu1": "k"})
    endpoints = build_endpoints(settings, secrets, ("infer",))
    assert [(endpoint.name, endpoint.path.name) for endpoint in endpoints] == [
        ("infer-gpu1", "infer-gpu1.sock"),
        ("infer-gpu2", "infer-gpu2.sock"),
    ]
    assert sock_dir / "gpu1.key" in own_paths(settings)
    # Each is counted under its own socket's name, by the inference routes.
    app = endpoints[0].app
    assert isinstance(app, Instrumented)
    assert app.socket == "infer-gpu1"
    assert app.route("POST", "/v1/chat/completions") == "/v1/chat/completions"
    assert app.route("POST", "/slots/0") == "/slots/{id}"
    assert app.route("POST", "/models/load") == "other"


async def serve_briefly(
    endpoints: list[Endpoint],
    socket_dir: Path,
    stop: anyio.Event,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    await serve(endpoints, socket_dir, stop, graceful_shutdown_s=1, task_status=task_status)
