"""Fixtures for the tools tests: the shipped tools file, a workspace and its surroundings."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.config import CORE_TOOLS_FILE
from loopd.tools import (
    Sandbox,
    ToolContext,
    ToolLimits,
    ToolsSpec,
    detect_sandbox,
    load_tools_spec,
    make_tool_context,
    plain_sandbox,
)
from tests.tools.toolcall import LoopdBox

SECRET = "the-secret-outside-the-workspace"


@pytest.fixture(scope="session")
def tools_file() -> Path:
    return CORE_TOOLS_FILE


@pytest.fixture(scope="session")
def spec() -> ToolsSpec:
    return load_tools_spec(CORE_TOOLS_FILE)


@pytest.fixture(scope="session")
def detected_sandbox() -> Sandbox:
    return anyio.run(detect_sandbox)


@pytest.fixture
def bwrap_sandbox(detected_sandbox: Sandbox) -> Sandbox:
    if not detected_sandbox.isolated:
        pytest.skip(f"bubblewrap does not work here: {detected_sandbox.reason}")
    return detected_sandbox


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path.resolve()  # as loopd keeps it, so tests can compare paths directly


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the workspace holding a secret; no tool may read or change it."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text(SECRET)
    return path


MakeContext = Callable[..., ToolContext]


@pytest.fixture
def make_ctx(workspace: Path, spec: ToolsSpec) -> MakeContext:
    def make(sandbox: Sandbox | None = None, **limits: Any) -> ToolContext:
        return make_tool_context(
            workspace, spec, sandbox or plain_sandbox("tests"), limits=ToolLimits(**limits)
        )

    return make


@pytest.fixture
def ctx(make_ctx: MakeContext) -> ToolContext:
    return make_ctx()


@pytest.fixture
def box(tmp_path: Path) -> LoopdBox:
    """A loopd state directory for ``loopd tools call`` run as a subprocess."""
    return LoopdBox(tmp_path)
