"""The real-agent tier: the real llama-server serving the tool model (``qwen-coder-tools``), a
model that makes its own tool calls, and the agent model (``qwen-coder-agent``), which also
answers after a tool result, each on a router of its own with only that model loaded.

Each is started once for the tier, on a Unix socket, when a test first asks for it; when a model
or the server is missing the tests FAIL with the command to run (``make llama-server``), never
skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopd_dev import devserver


@pytest.fixture(scope="package")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    yield from _router(tmp_path_factory, devserver.TOOL_MODEL)


@pytest.fixture(scope="package")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    yield from _router(tmp_path_factory, devserver.AGENT_MODEL)


def _router(
    tmp_path_factory: pytest.TempPathFactory, model: str
) -> Iterator[devserver.RunningServer]:
    workdir = tmp_path_factory.mktemp(model)
    try:
        server = devserver.start(
            workdir,
            devserver.default_cache_dir(),
            socket_path=workdir / "llama.sock",
            load=(model,),
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server with {model} is required: {exc}")
    try:
        yield server
    finally:
        server.stop()
