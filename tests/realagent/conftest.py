"""The real-agent tier: the real llama-server serving the tool model (``qwen-coder-tools``), a
model that makes its own tool calls, on a router of this tier's own with only that model loaded.

Started once for the tier, on a Unix socket; when the model or the server is missing the tests
FAIL with the command to run (``make llama-server``), never skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopd_dev import devserver


@pytest.fixture(scope="package")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    workdir = tmp_path_factory.mktemp("tool-server")
    try:
        server = devserver.start(
            workdir,
            devserver.default_cache_dir(),
            socket_path=workdir / "llama.sock",
            load=(devserver.TOOL_MODEL,),
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server with the tool model is required: {exc}")
    try:
        yield server
    finally:
        server.stop()
