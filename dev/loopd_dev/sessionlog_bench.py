"""Measurements for ``make bench``: append latency and request-message build time.

``measure(workdir)`` builds sessions of the given sizes in a fresh log under ``workdir`` and
returns the numbers; printing and plotting are the caller's.
"""

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loopd.sessionlog.records import RequestKind, RequestRecord
from loopd.sessionlog.replay import messages_array
from loopd.sessionlog.store import SessionLog

_TOOLS = '[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]'
_ASSISTANT = (
    '{"role":"assistant","content":"Done: the file has 42 lines.","reasoning_content":'
    '"The user wants the count; read it first.","tool_calls":[{"id":"call_%d","type":"function",'
    '"function":{"name":"read_file","arguments":"{\\"path\\": \\"src/main.py\\"}"}}]}'
)


@dataclass(frozen=True, slots=True)
class BenchResult:
    append_p50_ms: float
    append_p99_ms: float
    build_ms: dict[int, float]  # entries in the session -> median time to build its messages


def measure(
    workdir: Path, sizes: Sequence[int] = (100, 1_000, 10_000), appends: int = 200
) -> BenchResult:
    """Append latency over ``appends`` single appends (each its own fsynced transaction), and
    the median time to build the request messages of a session of each size."""
    with SessionLog.open(workdir / "bench-sessionlog.db") as log:
        latencies = _append_latencies(log, appends)
        build_ms = {size: _build_time(log, size) for size in sizes}
    latencies.sort()
    return BenchResult(
        append_p50_ms=statistics.median(latencies),
        append_p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        build_ms=build_ms,
    )


def _append_latencies(log: SessionLog, appends: int) -> list[float]:
    log.ensure_session("bench-latency", 0)
    log.start_epoch("bench-latency", reason="bench", tools_text=_TOOLS, system_text="bench")
    latencies = []
    for index in range(appends):
        started = time.perf_counter()
        log.append_user("bench-latency", f"message {index}", external_key=f"latency-{index}")
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _build_time(log: SessionLog, size: int, repeats: int = 5) -> float:
    name = f"bench-{size}"
    log.ensure_session(name, 0)
    epoch = log.start_epoch(name, reason="bench", tools_text=_TOOLS, system_text="bench")
    with log.transaction():  # filling is not what is measured: one transaction, one fsync
        for index in range(size - 1):  # the epoch entry is the first of the session's entries
            step = index % 3
            if step == 0:
                log.append_user(name, f"question {index} ✓", external_key=f"{name}-{index}")
            elif step == 1:
                record = RequestRecord(RequestKind.TURN, 0, epoch.number, index + 1, "0" * 64)
                log.append_assistant(name, _ASSISTANT % index, request=record)
            else:
                log.append_tool_result(name, tool_call_id=f"call_{index - 1}", content="42 lines")
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        messages_array(log.replay_messages(name))
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)
