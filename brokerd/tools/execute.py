"""Running a checked call with its limits: a timeout, an output cap (the head, read no further),
and for host commands confinement (``brokerd.confine``): no shell, a clean environment, a sandbox
that shows only what the tool declared, resource limits, and the whole process tree killed when
a limit is hit."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import Process

from brokerd.confine import ConfinementError, bind, open_confined
from brokerd.tools.builtins import BuiltinContext, BuiltinHandler
from brokerd.tools.calls import Ready
from brokerd.tools.catalogue import BuiltinRun, CommandRun, ConfineSpec, ToolSpec
from brokerd.tools.errors import ToolFailure
from brokerd.tools.settings import BrokerSettings
from brokerd.tools.wording import ToolOutcome
from loopcommon.capture import CappedOutput
from loopcommon.sandbox import (
    Bind,
    Confinement,
    HiddenPath,
    HostView,
    ResourceLimits,
    kill_group,
)

# A host command sees only this and its catalogue env, never brokerd's own environment: brokerd
# holds the chat token and other secrets that must not reach a tool (docs/design, invariant 6).
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
READ_CHUNK = 64 * 1024
REAP_GRACE_S = 5.0


@dataclass(frozen=True)
class Confiner:
    """How this broker confines its command tools: the host's sandbox parts and what to hide."""

    view: HostView
    hidden: tuple[HiddenPath, ...]

    def confinement(self, spec: ConfineSpec, roots: Sequence[Path]) -> Confinement:
        """The tool's declaration plus the allowed folders holding this call's path arguments."""
        binds: list[Bind] = [bind(Path(path)) for path in spec.read_only]
        binds += [bind(Path(path), writable=True) for path in spec.read_write]
        binds += [bind(root) for root in roots]
        defaults = ResourceLimits()
        limits = ResourceLimits(
            address_space_bytes=spec.address_space_bytes or defaults.address_space_bytes,
            file_size_bytes=spec.file_size_bytes or defaults.file_size_bytes,
            processes=spec.processes or defaults.processes,
            cpu_s=spec.cpu_s or defaults.cpu_s,
        )
        return Confinement(tuple(binds), spec.network, self.hidden, limits)


@dataclass(frozen=True)
class CallLimits:
    timeout_s: float
    output_cap_bytes: int


def limits_for(spec: ToolSpec, settings: BrokerSettings) -> CallLimits:
    """The tool's own limits, else the broker's defaults."""
    return CallLimits(
        timeout_s=spec.timeout_s or settings.default_timeout_s,
        output_cap_bytes=spec.output_cap_bytes or settings.default_output_cap_bytes,
    )


async def execute(
    call: Ready,
    limits: CallLimits,
    builtins: Mapping[str, BuiltinHandler],
    context: BuiltinContext,
    confiner: Confiner | None = None,
) -> ToolOutcome:
    """Run ``call`` within ``limits``; failures of the tool become an outcome, never an error.

    ``confiner`` is needed for command tools (the broker has one whenever its catalogue does).
    """
    output = CappedOutput(limits.output_cap_bytes)
    failure = ""
    with anyio.move_on_after(limits.timeout_s) as scope:
        try:
            failure = await _run(call, output, builtins, context, confiner)
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
    confiner: Confiner | None,
) -> str:
    """Returns "" on success, else why the tool failed (a non-zero exit status)."""
    run = call.spec.run
    if isinstance(run, BuiltinRun):
        await builtins[run.handler](call.arguments, output, context)
        return ""
    assert isinstance(run, CommandRun)
    assert call.argv is not None, "plan_call builds the argv of every command tool"
    assert confiner is not None, "a broker with command tools has a confiner"
    confinement = confiner.confinement(call.spec.confine, call.roots)
    env = {**BASE_ENV, **run.env}
    exit_status = await run_command(confiner.view, confinement, call.argv, env, output)
    if exit_status != 0 and not output.cut:
        return f"exited with status {exit_status}"
    return ""


async def run_command(
    view: HostView,
    confinement: Confinement,
    argv: Sequence[str],
    env: Mapping[str, str],
    output: CappedOutput,
) -> int:
    """Run ``argv`` confined (stdout and stderr together into ``output``); its exit status.

    Reading stops at the cap and the sandbox is killed, so a tool that writes without end costs
    at most one cap of memory. Cancellation (the timeout) kills the sandbox too.
    """
    try:
        process = await open_confined(view, confinement, argv, env)
    except (OSError, ConfinementError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ToolFailure(f"cannot start {argv[0]!r}: {detail}") from exc
    finished = False
    try:
        await _read_capped(process, output)
        if output.cut:
            kill_group(process.pid)
        exit_status = await process.wait()
        finished = True
        return exit_status
    finally:
        if not finished:
            # The output pipe is still open, so some member of the group is alive and Linux
            # cannot have given the group's id to another process.
            kill_group(process.pid)
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
