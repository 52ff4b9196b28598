"""The host's disk usage, read by brokerd itself (the ``disk_usage`` builtin).

A confined ``df`` would see only its sandbox's mounts, and showing it the host's whole tree to
fix that would undo the confinement; the numbers need no program at all: the mount table and one
``statvfs`` per file system. The table is formatted like ``df -h -P``.
"""

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from loopcommon.capture import CappedOutput

MOUNTS_FILE = "/proc/self/mounts"
# Kernel and virtual file systems: no disk behind them.
VIRTUAL_TYPES = frozenset(
    {
        "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts",
        "devtmpfs", "efivarfs", "fusectl", "hugetlbfs", "mqueue", "nsfs", "proc", "pstore",
        "securityfs", "sysfs", "tracefs", "ramfs", "rpc_pipefs", "squashfs", "overlay", "tmpfs",
    }
)  # fmt: skip
HEADER = ("Filesystem", "Size", "Used", "Avail", "Use%", "Mounted on")


@dataclass(frozen=True)
class Mounted:
    device: str
    mount_point: str
    fs_type: str


@dataclass(frozen=True)
class DiskUsage:
    device: str
    mount_point: str
    size: int
    used: int
    available: int


def parse_mounts(text: str) -> list[Mounted]:
    """The real file systems of a mounts table, each mount point once (the first mount)."""
    seen: set[str] = set()
    mounted = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        device, point, fs_type = (_unescape(field) for field in fields[:3])
        if fs_type in VIRTUAL_TYPES or point in seen:
            continue
        seen.add(point)
        mounted.append(Mounted(device, point, fs_type))
    return mounted


def human(size: int) -> str:
    """``df -h``'s sizes: powers of 1024, one decimal below 10, rounded up."""
    value = float(size)
    for unit in ("", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            if unit == "":
                return str(int(value))
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_table(usages: Sequence[DiskUsage]) -> str:
    rows = [HEADER]
    for usage in usages:
        share = usage.used / (usage.used + usage.available) if usage.used else 0.0
        percent = f"{-(-int(share * 1000) // 10)}%"
        rows.append(
            (
                usage.device,
                human(usage.size),
                human(usage.used),
                human(usage.available),
                percent,
                usage.mount_point,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(widths[i]) for i, cell in enumerate(row[1:5], start=1)]
        lines.append(" ".join([*cells, row[5]]))
    return "\n".join(lines) + "\n"


def measure(mounted: Iterable[Mounted]) -> list[DiskUsage]:
    usages = []
    for mount in mounted:
        try:
            stats = os.statvfs(mount.mount_point)
        except OSError:
            continue  # gone, or not ours to read
        if stats.f_blocks == 0:
            continue
        size = stats.f_blocks * stats.f_frsize
        free = stats.f_bfree * stats.f_frsize
        available = stats.f_bavail * stats.f_frsize
        usages.append(DiskUsage(mount.device, mount.mount_point, size, size - free, available))
    return usages


async def disk_usage(arguments: Mapping[str, Any], output: CappedOutput, context: Any) -> None:
    """Size, used and free space of every mounted disk file system of the host."""
    text = await anyio.Path(MOUNTS_FILE).read_text()
    # statvfs of a hung network mount blocks: off the event loop, and left behind at the timeout.
    usages = await anyio.to_thread.run_sync(measure, parse_mounts(text), abandon_on_cancel=True)
    output.add(format_table(usages).encode())


def _unescape(field: str) -> str:
    """The mounts table writes space, tab, newline and backslash as octal escapes."""
    for escape, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escape, char)
    return field
