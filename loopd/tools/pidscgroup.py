"""A pids cgroup per command, for loopd running as root.

The process cap of run_command is ``RLIMIT_NPROC`` (set by ``launcher``), which the kernel does not
apply to root. When loopd runs as root it puts each command in a cgroup of its own whose
``pids.max`` is the cap instead, where this machine lets it make one: a cgroup v1 ``pids``
hierarchy, or cgroup v2 with the ``pids`` controller available where loopd's own cgroup is the
root (v2 allows no child cgroup with controllers beside processes). Elsewhere there is none, and
``Sandbox.warning`` says the process cap does not hold.
"""

import errno
import functools
import logging
import os
import time
import uuid
from pathlib import Path

log = logging.getLogger("loopd.tools")

_PREFIX = "loopd-command-"
_RMDIR_TRIES = 50


# --- pure decisions ----------------------------------------------------------------------------


def candidate_parents(mountinfo: str, self_cgroup: str) -> list[Path]:
    """Where a pids cgroup could be made, from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``.

    v1: the ``pids`` hierarchy's mount plus this process's path in it. v2: the unified mount,
    only when this process sits at its root.
    """
    v1_path = v2_path = None
    for line in self_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2_path = path
        elif "pids" in controllers.split(","):
            v1_path = path
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount_point = fields[4]
        kind, _, rest = line.partition(" - ")[2].partition(" ")
        options = rest.split()[-1].split(",") if rest.split() else []
        if kind == "cgroup" and "pids" in options and v1_path is not None:
            found.append(Path(mount_point) / v1_path.lstrip("/"))
        elif kind == "cgroup2" and v2_path == "/":
            found.append(Path(mount_point))
    return found


# --- the file system ---------------------------------------------------------------------------


@functools.cache
def pids_cgroup_parent() -> Path | None:
    """The directory under which a command's pids cgroup can be made, or None (probed once)."""
    if os.geteuid() != 0:
        return None
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        self_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for parent in candidate_parents(mountinfo, self_cgroup):
        if _usable(parent):
            return parent
    return None


def _usable(parent: Path) -> bool:
    subtree = parent / "cgroup.subtree_control"
    if subtree.exists() and "pids" not in _read(subtree).split():
        return False  # v2, and the pids controller is not given to child cgroups here
    probe = parent / f"{_PREFIX}probe-{uuid.uuid4().hex}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "pids.max").exists()
    finally:
        remove(probe)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def make(parent: Path, max_tasks: int) -> Path | None:
    """A new cgroup for one command, capped at ``max_tasks``; None when it cannot be made."""
    path = parent / f"{_PREFIX}{uuid.uuid4().hex}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_tasks))
    except OSError as exc:
        log.warning("no pids cgroup for this command (%s); its process cap does not hold", exc)
        remove(path)
        return None
    return path


def remove(path: Path) -> None:
    """Remove a command's cgroup; a task just killed may hold it for a moment."""
    for _ in range(_RMDIR_TRIES):
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("could not remove the cgroup %s: %s", path, exc)
                return
            time.sleep(0.01)
        else:
            return
    log.warning("could not remove the cgroup %s: still busy", path)
