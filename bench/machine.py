"""What the benchmarks ran on, for the report: cores, memory, CPU model, load.

The parsing is pure (tested on sample ``/proc`` text); ``describe`` reads this machine.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    cpu_model: str
    cores: int  # usable by this process, as ``nproc`` prints it
    memory_gib: float
    python: str
    system: str


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` (``unknown`` when there is none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return "unknown"


def memory_gib(meminfo: str) -> float:
    """``MemTotal`` of ``/proc/meminfo`` in GiB (0.0 when absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / (1024 * 1024)
    return 0.0


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews every time measured."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def describe() -> Machine:
    return Machine(
        cpu_model=cpu_model(_read("/proc/cpuinfo")),
        cores=len(os.sched_getaffinity(0)),
        memory_gib=memory_gib(_read("/proc/meminfo")),
        python=platform.python_version(),
        system=f"{platform.system()} {platform.release()}",
    )
