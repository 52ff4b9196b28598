"""One session fills the disk under everyone's session log, past what loopd's quota catches: the
shipped units put the workspaces and the state on filesystems of their own, of the sizes the
operator gives deploy/volumes.sh, and the kernel holds each to its size.

The test runs deploy/volumes.sh as root (in a mount namespace of its own), then loopd's image
under rootless podman, as the image test's account, with loopd.container's own volume mounts and
isolation: in the box, a process that loopd's quota does not watch fills /workspace, then the
session log on /var/lib/loopd records it.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts import quadlet
from tests.image.image_support import (
    Operator,
    containers_conf,
    image_archive,
    missing_prerequisites,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
VOLUMES = ("state", "workspace")
MIB = 1024**2
STATE_MIB, WORKSPACE_MIB = 32, 64
IMAGE = "localhost/loopd:latest"


@dataclass
class Namespace:
    """A mount namespace of the test's own, held open by a child that ends when its stdin
    closes: the filesystems mounted in it are seen by nothing else on the machine, and go (with
    their loop devices) when it ends."""

    holder: subprocess.Popen[bytes]

    @classmethod
    def start(cls) -> Namespace:
        # The line comes once the namespace is made: entering the holder earlier would enter
        # the machine's own namespace and mount there.
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "echo in; exec cat"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert holder.stdout is not None
        line = holder.stdout.readline()
        holder.stdout.close()
        assert line == b"in\n", line
        assert os.readlink(f"/proc/{holder.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        return cls(holder)

    def run(
        self, argv: Sequence[str], operator: Operator | None = None
    ) -> subprocess.CompletedProcess[str]:
        enter = ["nsenter", "-t", str(self.holder.pid), "-m", "--"]
        if operator is not None:
            assignments = [f"{key}={value}" for key, value in operator.env().items()]
            enter += ["runuser", "-u", operator.name, "--", "env", "-i", *assignments]
        return subprocess.run(
            [*enter, *argv],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=operator.home if operator else None,
            stdin=subprocess.DEVNULL,
        )

    def check(self, argv: Sequence[str], operator: Operator | None = None) -> str:
        result = self.run(argv, operator)
        assert result.returncode == 0, f"{shlex.join(argv)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def stop(self) -> None:
        assert self.holder.stdin is not None
        self.holder.stdin.close()
        self.holder.wait(timeout=60)


# What the box does: fill /workspace until the kernel refuses, then record that in the session
# log on /var/lib/loopd. The writes are bounded by bytes (twice the workspace size).
IN_THE_BOX = """
import errno, json, os, sys
from loopd.sessionlog.store import SessionLog

def room(path):
    st = os.statvfs(path)
    return {"size": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}

limit = 2 * int(sys.argv[1])
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]
seen = {"caps": caps, "workspace": room("/workspace"), "state": room("/var/lib/loopd")}
written, error = 0, None
fd = os.open("/workspace/fill", os.O_WRONLY | os.O_CREAT, 0o600)
chunk = os.urandom(1024 * 1024)
try:
    while written < limit:
        written += os.write(fd, chunk)
except OSError as exc:
    error = errno.errorcode[exc.errno]
os.close(fd)
seen.update(written=written, error=error, workspace_full=room("/workspace"))
text = f"run_command: {error} after {written} bytes in /workspace"
with SessionLog.open("/var/lib/loopd/loopd.db") as log:
    log.ensure_session("filler", 0)
    log.start_epoch("filler", reason="new session", tools_text="[]", system_text="Be brief.")
    log.append_note("filler", text)
    seen["recorded"] = [e.fields.text for e in log.entries("filler") if e.fields.text == text]
seen["state_after"] = room("/var/lib/loopd")
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def operator() -> Iterator[Operator]:
    missing = missing_prerequisites()
    if missing:
        pytest.fail("the volume test cannot run here; missing: " + "; ".join(missing))
    operator = Operator.make()
    config = operator.home / ".config" / "containers"
    config.mkdir(parents=True)
    shutil.copy(containers_conf(), config / "containers.conf")
    for path in (operator.home / ".config", config, config / "containers.conf"):
        operator.give(path)
    try:
        os.link(image_archive(), operator.root / "image.tar")
    except OSError:
        shutil.copy(image_archive(), operator.root / "image.tar")
    (operator.root / "image.tar").chmod(0o644)
    yield operator
    shutil.rmtree(operator.root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.attack(
    attack="A process in the box fills the disk under everyone's session log, faster than "
    "loopd's quota measures or where it does not look",
    input="deploy/volumes.sh --state-size 32M --workspace-size 64M; loopd's image under rootless "
    "podman with loopd.container's volume mounts; a process writing /workspace until refused, "
    "then a note appended to the session log",
    expected="the kernel refuses the writes at the workspace filesystem's size (ENOSPC); the box "
    "has no capability to grow it; the state's filesystem keeps its room and the note is recorded",
)
def test_a_full_workspace_filesystem_leaves_the_session_log_room(
    operator: Operator, observed: Callable[[str], None]
) -> None:
    namespace = Namespace.start()
    try:
        # Root's step, before any podman of the account's runs (its namespace copies the mounts).
        printed = namespace.check(
            [
                "bash",
                str(DEPLOY / "volumes.sh"),
                "--user",
                operator.name,
                "--home",
                str(operator.home),
                "--images",
                str(operator.root / "images"),
                "--fstab",
                str(operator.root / "fstab"),
                "--state-size",
                f"{STATE_MIB}M",
                "--workspace-size",
                f"{WORKSPACE_MIB}M",
            ]
        )
        lines = printed.splitlines()
        assert [line.split(":")[1].strip() for line in lines] == list(VOLUMES), printed
        fstab = (operator.root / "fstab").read_text().splitlines()
        assert len(fstab) == 2
        assert all(" ext4 loop,nodev,nosuid " in line for line in fstab), fstab

        namespace.check(["podman", "load", "-q", "-i", str(operator.root / "image.tar")], operator)
        specifiers = {"h": str(operator.home)}
        container, volumes = quadlet.load_container(DEPLOY / "loopd.container")
        for filename, unit in volumes.items():
            create = quadlet.volume_create_args(unit, filename)
            assert create is not None, filename
            namespace.check(["podman", *(quadlet.expand(a, specifiers) for a in create)], operator)
        # The unit's own isolation and volume mounts; nothing else of it (no brokerd here).
        args = quadlet.podman_run_args(container, volumes, under_systemd=False)
        mounts = [
            word
            for flag, word in itertools.pairwise(args)
            if flag == "-v" and word.startswith(("loopd-state:", "loopd-workspace:"))
        ]
        assert len(mounts) == 2, args
        userns = args[args.index("--userns") + 1]
        run = ["podman", "run", "--rm", "--network", "none", "--read-only=true"]
        run += ["--cap-drop", "all", "--security-opt=no-new-privileges", "--userns", userns]
        for mount in mounts:
            run += ["-v", mount]
        run += ["--entrypoint", "/opt/loopd/bin/python", IMAGE, "-c", IN_THE_BOX]
        seen = json.loads(namespace.check([*run, str(WORKSPACE_MIB * MIB)], operator))
    finally:
        namespace.run(["podman", "system", "reset", "--force"], operator)
        namespace.stop()

    sizes = {name: seen[name]["size"] / MIB for name in VOLUMES}
    observed(
        f"workspace {sizes['workspace']:.0f} MiB, state {sizes['state']:.0f} MiB (ext4); "
        f"writes refused with {seen['error']} after {seen['written'] / MIB:.1f} MiB; "
        f"capabilities in the box {seen['caps']}; state free after "
        f"{seen['state_after']['free'] / MIB:.1f} MiB; note recorded: {bool(seen['recorded'])}"
    )
    assert int(seen["caps"], 16) == 0  # nothing in the box may remount or grow a filesystem
    # Each volume is its filesystem, of the size given (less ext4's own tables and journal).
    assert 0.75 * WORKSPACE_MIB * MIB <= seen["workspace"]["size"] <= WORKSPACE_MIB * MIB
    assert 0.75 * STATE_MIB * MIB <= seen["state"]["size"] <= STATE_MIB * MIB
    assert seen["error"] == "ENOSPC"
    assert seen["written"] <= WORKSPACE_MIB * MIB
    assert seen["workspace_full"]["free"] < MIB
    # The state's filesystem kept its room, and the session log recorded the failure.
    assert seen["recorded"] == [f"run_command: ENOSPC after {seen['written']} bytes in /workspace"]
    assert seen["state_after"]["free"] > seen["state"]["free"] - 2 * MIB
