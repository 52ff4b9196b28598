"""Running a checked call with its limits: a timeout, an output cap, and for host commands no
shell, a clean environment and a process group that is killed whole when the limits are hit."""

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

import anyio
from anyio.abc import Process

from brokerd.tools.builtins import BuiltinContext, BuiltinHandler
from brokerd.tools.calls import Ready
from brokerd.tools.capture import CappedOutput
from brokerd.tools.catalogue import BuiltinRun, CommandRun, ToolSpec
from brokerd.tools.errors import ToolFailure
from brokerd.tools.settings import BrokerSettings
from brokerd.tools.wording import ToolOutcome

# A host command sees only this and its catalogue env, never brokerd's own environment: brokerd
# holds the chat token and other secrets that must not reach a tool (DESIGN invariant 6).
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
READ_CHUNK = 64 * 1024
REAP_GRACE_S = 5.0


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    output_cap_bytes: int


def limits_for(spec: ToolSpec, settings: BrokerSettings) -> Limits:
    """The tool's own limits, else the broker's defaults."""
    return Limits(
        timeout_s=spec.timeout_s or settings.default_timeout_s,
        output_cap_bytes=spec.output_cap_bytes or settings.default_output_cap_bytes,
    )


async def execute(
    call: Ready,
    limits: Limits,
    builtins: Mapping[str, BuiltinHandler],
    context: BuiltinContext,
) -> ToolOutcome:
    """Run ``call`` within ``limits``; failures of the tool become an outcome, never an error."""
    output = CappedOutput(limits.output_cap_bytes)
    failure = ""
    with anyio.move_on_after(limits.timeout_s) as scope:
        try:
            failure = await _run(call, output, builtins, context)
        except ToolFailure as exc:
            failure = str(exc)
    if scope.cancelled_caught:
        timed_out = f"timed out after {limits.timeout_s:g} s"
        return ToolOutcome("timeout", output.text(), output.cut, output.cap, timed_out)
    return ToolOutcome("error" if failure else "ok", output.text(), output.cut, output.cap, failure)


async def _run(
    call: Ready,
    output: CappedOutput,
    builtins: Mapping[str, BuiltinHandler],
    context: BuiltinContext,
) -> str:
    """Returns "" on success, else why the tool failed (a non-zero exit status)."""
    run = call.spec.run
    if isinstance(run, BuiltinRun):
        await builtins[run.handler](call.arguments, output, context)
        return ""
    assert isinstance(run, CommandRun)
    assert call.argv is not None, "plan_call builds the argv of every command tool"
    exit_status = await run_command(call.argv, {**BASE_ENV, **run.env}, output)
    if exit_status != 0 and not output.cut:
        return f"exited with status {exit_status}"
    return ""


async def run_command(argv: tuple[str, ...], env: Mapping[str, str], output: CappedOutput) -> int:
    """Run ``argv`` (stdout and stderr together into ``output``) and return its exit status.

    Reading stops at the cap and the process group is killed, so a tool that writes without end
    costs at most one cap of memory. Cancellation (the timeout) kills the group too.
    """
    try:
        process = await anyio.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd="/",
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolFailure(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
    finished = False
    try:
        await _read_capped(process, output)
        if output.cut:
            _kill_group(process)
        exit_status = await process.wait()
        finished = True
        return exit_status
    finally:
        if not finished:
            _kill_group(process)
        with anyio.move_on_after(REAP_GRACE_S, shield=True):
            await process.aclose()


async def _read_capped(process: Process, output: CappedOutput) -> None:
    assert process.stdout is not None
    while True:
        try:
            chunk = await process.stdout.receive(READ_CHUNK)
        except anyio.EndOfStream:
            return
        if not output.add(chunk):
            return


def _kill_group(process: Process) -> None:
    # The whole group, not just the leader: a child still holding the pipe would outlive it.
    # Called only while the output pipe is still open, so some member is alive and Linux cannot
    # have given the group's id to another process.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
