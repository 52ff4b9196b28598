"""The kernel's privileged paths from inside a sandbox: capabilities, and a user namespace of the
command's own (which makes it root there, and opens most of the kernel's attack surface to it).

Both daemons build their sandbox with ``loopcommon.sandbox``: loopd's ``run_command`` and a
brokerd command tool each run a probe that reads its capability sets and tries ``unshare -U``,
as root and as a plain user (nobody). Each case is one row of docs/security.md's table.
"""

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from brokerd.confine import confined_argv, detect_host_view
from brokerd.tools.execute import BASE_ENV
from loopcommon.sandbox import Confinement
from loopd.tools import Sandbox, detect_sandbox
from loopd.tools.command import command_limits, run_command
from loopd.tools.limits import ToolLimits
from tests.tools.toolcall import as_nobody, open_folder, standalone_launcher

PROBE = (
    "grep -E '^Cap(Prm|Eff|Bnd):' /proc/self/status | tr -s '\\t' ' '; "
    'if out=$(unshare -U true 2>&1); then echo "unshare -U: allowed"; '
    'else echo "unshare -U: refused ($out)"; fi'
)
NONE = "0000000000000000"
EXPECTED = [f"CapPrm: {NONE}", f"CapEff: {NONE}", f"CapBnd: {NONE}"]
ATTACK = dict(
    attack="A command in the sandbox uses the kernel's privileged paths: a capability, or a "
    "user namespace of its own",
    input="a command reading CapPrm, CapEff and CapBnd of /proc/self/status, then unshare -U "
    "true; in run_command's sandbox and in a brokerd command tool's, as root and as nobody",
    expected="every capability set is 0, even root's; unshare -U is refused",
)


@pytest.fixture(scope="module")
def detected() -> Sandbox:
    sandbox = anyio.run(detect_sandbox)
    if not sandbox.isolated:
        pytest.fail(f"bubblewrap is installed for these tests but does not work: {sandbox.reason}")
    return sandbox


@pytest.fixture
def open_place() -> Iterator[Path]:
    with open_folder("loopd-privileges-") as place:
        yield place


def run_as(user: str) -> list[str]:
    """The prefix that runs a command as ``user``: root needs the tests to run as root; nobody
    is set by setpriv (or is who runs the tests already)."""
    if user == "root":
        if os.geteuid() != 0:
            pytest.skip("only root can show what root's sandbox holds; these tests run as a user")
        return []
    return as_nobody([])


def seen(output: str) -> list[str]:
    return [line.strip() for line in output.strip().splitlines()]


def check(who: str, lines: list[str], observed: Callable[[str], None]) -> None:
    observed("; ".join(lines))
    print("\n".join([f"\n{who}:", *lines]))  # what the sandbox saw, shown with pytest -s
    assert lines[:3] == EXPECTED
    assert len(lines) == 4
    assert lines[3].startswith("unshare -U: refused ("), lines[3]


@pytest.mark.attack(**ATTACK)
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_run_commands_sandbox_holds_no_privilege(
    user: str, detected: Sandbox, open_place: Path, observed: Callable[[str], None]
) -> None:
    prefix = run_as(user)
    if user == "root":
        # The path loopd's engine takes, in this process.
        outcome = anyio.run(
            lambda: run_command(
                PROBE, workspace=open_place, sandbox=detected, timeout_s=60, output_max_bytes=4000
            )
        )
        assert outcome.exit_code == 0, outcome.output
        check("run_command as root", seen(outcome.output), observed)
        return
    # The launcher and the sandbox's command line as run_command makes them, started as nobody.
    command = detected.argv(open_place, PROBE)
    done = subprocess.run(
        [*prefix, *standalone_launcher(open_place, command_limits(ToolLimits()), command)],
        cwd=open_place,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check(f"run_command as {user}", seen(done.stdout), observed)


@pytest.mark.attack(**ATTACK)
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_brokerd_command_tools_sandbox_holds_no_privilege(
    user: str, observed: Callable[[str], None]
) -> None:
    argv = confined_argv(detect_host_view(), Confinement(), ["sh", "-c", PROBE], BASE_ENV)
    done = subprocess.run(
        [*run_as(user), *argv], capture_output=True, text=True, timeout=60, env={}, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check(f"a brokerd command tool as {user}", seen(done.stdout), observed)
