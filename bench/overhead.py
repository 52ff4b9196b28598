"""loopd's own cost away from the server: the session log, memory, and CPU share of turns."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError
from bench.memory import MemorySample
from bench.stats import Spread
from loopd_dev.sessionlog_bench import measure as measure_log

BUILD_SIZES = (100, 1_000, 10_000)
APPENDS = 200


@dataclass(frozen=True)
class LogCost:
    append_p50_ms: Spread
    append_p99_ms: Spread
    build_ms: dict[int, Spread]  # entries in the session -> time to build its request messages
    appends: int


@dataclass(frozen=True)
class CpuShare:
    what: str
    share: Spread  # loopd's CPU seconds / the turn's wall seconds
    per_token_ms: Spread | None = None  # loopd's CPU milliseconds per generated token


def log_cost(repeats: int, sizes: Sequence[int] = BUILD_SIZES, appends: int = APPENDS) -> LogCost:
    """``loopd_dev.sessionlog_bench.measure`` in a fresh log per run."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-log-") as tmp:
            runs.append(measure_log(Path(tmp), sizes, appends))
    return LogCost(
        append_p50_ms=Spread.of([run.append_p50_ms for run in runs]),
        append_p99_ms=Spread.of([run.append_p99_ms for run in runs]),
        build_ms={size: Spread.of([run.build_ms[size] for run in runs]) for size in sizes},
        appends=appends,
    )


def memory(repeats: int, sessions: int = 100) -> list[MemorySample]:
    samples = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "bench.memory", tmp, str(sessions)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
                cwd=Path(__file__).resolve().parent.parent,
            )
        if done.returncode != 0:
            raise BenchError(f"the memory benchmark failed:\n{done.stderr[-2000:]}")
        data = json.loads(done.stdout)
        if data["sessions"] != sessions:
            raise BenchError(f"the memory benchmark made {data['sessions']} sessions")
        samples.append(MemorySample(**data))
    return samples


def cpu_share(
    what: str,
    cpu_s: Sequence[float],
    wall_s: Sequence[float],
    tokens: Sequence[int] | None = None,
) -> CpuShare:
    """CPU over wall time per turn; with ``tokens`` (generated per turn), CPU per token too."""
    shares = [cpu / wall for cpu, wall in zip(cpu_s, wall_s, strict=True) if wall > 0]
    per_token = None
    if tokens is not None:
        per_token = Spread.of(
            [cpu * 1000 / n for cpu, n in zip(cpu_s, tokens, strict=True) if n > 0]
        )
    return CpuShare(what, Spread.of(shares), per_token)
