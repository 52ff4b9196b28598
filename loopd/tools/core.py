"""Run one core tool call as the model wrote it, and give back the text it will read.

``run_core_tool`` takes the tool name and the exact argument string from the assistant message.
Every way a call can go wrong on the model's side (arguments that are not JSON, that break the
tool's schema, a path outside the workspace, a file too large) comes back as a failed
``ToolResult`` whose text names the problem, so the model can correct itself on the next step.
Only a dispatch bug of the caller (handing over a broker tool) raises.
"""

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from loopd.tools import files
from loopd.tools.command import Sandbox, check_protected_paths, render_outcome, run_command
from loopd.tools.errors import NotACoreToolError, ToolFailure, ToolsSpecError
from loopd.tools.limits import ToolLimits
from loopd.tools.spec import ToolsSpec
from loopd.tools.workspace import Workspace

BROKER_TOOL_NAMES = frozenset({"find_tool", "call_tool"})
"""Declared in the tools file, but executed by brokerd, never here."""


def is_broker_tool(name: str) -> bool:
    """True for the tools that go to brokerd (``find_tool``, ``call_tool``)."""
    return name in BROKER_TOOL_NAMES


@dataclass(frozen=True)
class ToolResult:
    text: str
    ok: bool


@dataclass(frozen=True)
class ToolContext:
    """What a core tool call runs against; build it with ``make_tool_context``."""

    workspace: Path
    spec: ToolsSpec
    sandbox: Sandbox
    limits: ToolLimits = field(default_factory=ToolLimits)


def make_tool_context(
    workspace: Path,
    spec: ToolsSpec,
    sandbox: Sandbox,
    *,
    protected: Iterable[Path] = (),
    limits: ToolLimits | None = None,
) -> ToolContext:
    """Check the layout once at startup and build the context.

    ``protected`` are loopd's own paths (state directory, config file): refused when a tool
    could see them. Every tool in ``spec`` must be one this package or brokerd runs.
    """
    root = Workspace.at(workspace).root
    resolved = [Path(p).resolve() for p in protected]
    check_protected_paths(root, resolved, sandbox.visible_paths())
    check_spec_runnable(spec)
    return ToolContext(root, spec, sandbox, limits or ToolLimits())


def check_spec_runnable(spec: ToolsSpec) -> None:
    """Refuse a tools file that declares a tool nobody would run."""
    unknown = [name for name in spec.names if name not in _HANDLERS and not is_broker_tool(name)]
    if unknown:
        raise ToolsSpecError(f"tools file declares tools that nothing runs: {', '.join(unknown)}")


async def run_core_tool(name: str, arguments: str, ctx: ToolContext) -> ToolResult:
    """Run a core tool; the result text is capped at ``ctx.limits.result_max_chars``."""
    if is_broker_tool(name):
        raise NotACoreToolError(f"{name} is run by brokerd, not by run_core_tool")
    handler = _HANDLERS.get(name)
    if handler is None or name not in ctx.spec.schemas:
        return ToolResult(f"there is no tool {name!r}; the tools are {_names(ctx.spec)}", False)
    try:
        args = parse_arguments(name, arguments, ctx.spec.schemas[name])
        result = await handler(args, ctx)
    except ToolFailure as exc:
        result = ToolResult(str(exc), ok=False)
    return ToolResult(cap_text(result.text, ctx.limits.result_max_chars), result.ok)


# --- pure decisions ----------------------------------------------------------------------------


def parse_arguments(name: str, arguments: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The arguments as an object that satisfies ``schema``, or a ``ToolFailure`` saying why not.

    An empty string counts as ``{}``: some templates send it for a call without arguments.
    """
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolFailure(
            f"{name}: the arguments are not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}); send one JSON object"
        ) from None
    except RecursionError:
        raise ToolFailure(f"{name}: the arguments are nested too deeply") from None
    # jsonschema is imported by the first check of a call, not when loopd starts: a command that
    # never sees a tool call does not pay for it (tens of milliseconds, ``make bench``).
    from loopcommon.schemas import first_error

    error = first_error(schema, value)
    if error is not None:
        where = "".join(f"[{part!r}]" for part in error.absolute_path)
        at = f" at arguments{where}" if where else ""
        raise ToolFailure(f"{name}: invalid arguments{at}: {error.message}; {_usage(schema)}")
    if _has_lone_surrogate(value):
        raise ToolFailure(f"{name}: the arguments contain a lone surrogate (\\ud800-\\udfff)")
    return dict(value)


def _usage(schema: dict[str, Any]) -> str:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    described = [f"{key}{'' if key in required else ' (optional)'}" for key in properties]
    return f"the parameters are: {', '.join(described)}" if described else "it takes no arguments"


def _has_lone_surrogate(value: Any) -> bool:
    # JSON may spell them ("\ud800"); no file name or file content can hold one.
    if isinstance(value, str):
        return any("\ud800" <= char <= "\udfff" for char in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


def cap_text(text: str, max_chars: int) -> str:
    """Cut a result to ``max_chars``, with a note the model can see."""
    if len(text) <= max_chars:
        return text
    note = f"[result cut: {len(text):,} characters in all, the first {max_chars:,} shown]"
    return f"{text[:max_chars]}\n{note}"


def _names(spec: ToolsSpec) -> str:
    return ", ".join(spec.names)


# --- the handlers ------------------------------------------------------------------------------

_Handler = Callable[[dict[str, Any], ToolContext], Awaitable[ToolResult]]
_FileTool = Callable[[Workspace, dict[str, Any], ToolLimits], str]


def _file_tool(run: _FileTool) -> _Handler:
    """A blocking file tool, run in a worker thread so the event loop keeps serving streams."""

    async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        workspace = Workspace(ctx.workspace)
        text = await anyio.to_thread.run_sync(partial(run, workspace, args, ctx.limits))
        return ToolResult(text, ok=True)

    return handler


async def _run_command(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    limits = ctx.limits
    asked = float(args.get("timeout_s", limits.command_timeout_s))
    timeout_s = min(asked, limits.command_timeout_max_s)
    outcome = await run_command(
        args["command"],
        workspace=ctx.workspace,
        sandbox=ctx.sandbox,
        timeout_s=timeout_s,
        output_max_bytes=limits.command_output_max_bytes,
        limits=limits,
    )
    text = render_outcome(outcome, timeout_s)
    if "timeout_s" in args and asked > timeout_s:
        text = f"[timeout_s lowered to the limit of {timeout_s:g} s]\n{text}"
    return ToolResult(text, ok=outcome.exit_code == 0)


_HANDLERS: dict[str, _Handler] = {
    "read_file": _file_tool(
        lambda ws, a, lim: files.read_file(ws, a["path"], a.get("offset", 1), a.get("limit"), lim)
    ),
    "write_file": _file_tool(lambda ws, a, lim: files.write_file(ws, a["path"], a["content"], lim)),
    "edit_file": _file_tool(
        lambda ws, a, lim: files.edit_file(ws, a["path"], a["old_string"], a["new_string"], lim)
    ),
    "list_dir": _file_tool(lambda ws, a, lim: files.list_dir(ws, a.get("path", "."), lim)),
    "search_files": _file_tool(
        lambda ws, a, lim: files.search_files(
            ws, a["pattern"], a.get("path", "."), a.get("regex", False), lim
        )
    ),
    "run_command": _run_command,
}

CORE_TOOL_NAMES = frozenset(_HANDLERS)
"""The tools this module runs in the workspace."""
