"""``loopd tools call NAME --session SESSION 'JSON-ARGUMENTS'``: a core tool, run by hand.

It runs the tool in the session's workspace through the path the engine takes for a model's call
(``SessionTools.run_core``: the same workspace folder, sandbox, limits and caps), prints what the
model would read, and appends nothing to the session log. Exit status: 0 the tool ran, 1 the tool
reported an error (the model would read it as a failed call; for run_command, a non-zero exit),
2 bad usage (unknown tool or session, arguments that are not one JSON object): one line on
stderr. It is how an operator reproduces a tool problem, and how tests drive the tools from outside.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, TextIO

import anyio

from loopd.tools.core import CORE_TOOL_NAMES, is_broker_tool

if TYPE_CHECKING:
    from loopd.config import Settings

_PROG = "loopd tools call"


class UsageError(Exception):
    """The command line names no runnable call; ``str(exc)`` is the one line to print."""


def _core_names() -> list[str]:
    return sorted(CORE_TOOL_NAMES)


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    return anyio.run(
        call_tool, settings, args.name, args.session, args.arguments, sys.stdout, sys.stderr
    )


# --- pure checks -------------------------------------------------------------------------------


def check_call(name: str, arguments: str) -> None:
    """Refuse a tool loopd does not run here, or arguments that are not one JSON object."""
    if is_broker_tool(name):
        raise UsageError(
            f"{name} is run by brokerd, not by loopd; this command runs the core tools: "
            f"{', '.join(_core_names())}"
        )
    if name not in CORE_TOOL_NAMES:
        raise UsageError(f"unknown tool {name!r}; the core tools are {', '.join(_core_names())}")
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"the arguments are not valid JSON ({exc.msg} at column {exc.colno}); give one object"
        ) from None
    except RecursionError:
        raise UsageError("the arguments are nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError(f"the arguments must be one JSON object, not {type(value).__name__}")


# --- the command -------------------------------------------------------------------------------


async def call_tool(
    settings: Settings, name: str, session: str, arguments: str, out: TextIO, err: TextIO
) -> int:
    """Run the call and print its result; the exit status (see the module's doc). No server
    is needed (nor LOOPD_MODEL): a core tool runs here, in the session's workspace."""
    # The engine's modules, imported only when used.
    from loopd.sessionlog.store import SessionLog
    from loopd.sessions import SessionTools
    from loopd.tools.spec import load_tools_spec

    try:
        check_call(name, arguments)
    except UsageError as exc:
        return _bad_usage(err, str(exc))
    if not settings.db_path.exists():
        return _bad_usage(err, f"unknown session {session!r}: no session log at {settings.db_path}")
    with SessionLog.open(settings.db_path, create=False) as session_log:
        known = [s.name for s in session_log.sessions()]
        if session not in known:
            return _bad_usage(err, f"unknown session {session!r}; {_listing(known)}")
        tools = SessionTools.open(settings, load_tools_spec(settings.tools_file), session_log)
        try:
            result = await tools.run_core(session, name, arguments)
        finally:
            await tools.broker.aclose()
    out.write(f"{result.text}\n")
    return 0 if result.ok else 1


def _bad_usage(err: TextIO, line: str) -> int:
    err.write(f"{_PROG}: {line}\n")
    return 2


def _listing(names: list[str], most: int = 10) -> str:
    if not names:
        return "there are no sessions"
    shown = ", ".join(repr(name) for name in names[:most])
    return f"the sessions are: {shown}{', ...' if len(names) > most else ''}"
