"""Memory with idle sessions, in a fresh process: ``python -m bench.memory DIR [SESSIONS]``.

A fresh process, because RSS only grows: measured inside the benchmark run it would carry every
earlier benchmark's garbage. The child opens loopd's ``Runtime`` (settings, session log, server
and broker clients, tools), reads its RSS, then creates the idle sessions (100 unless told) as a
restart finds them: each with its epoch and a few finished turns in the log, and its state
derived once. Then it reads RSS again and prints both as one JSON line.
"""

from __future__ import annotations

import gc
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio

from loopcommon.jsonbytes import dumps
from loopd.config import load_settings
from loopd.sessionlog import RequestKind, RequestRecord
from loopd.sessions import Runtime

_ANSWER = dumps({"role": "assistant", "content": "Done: the build is green again."})


@dataclass(frozen=True)
class MemorySample:
    sessions: int
    rss_before_mib: float  # the runtime open, no session yet
    rss_after_mib: float  # with the idle sessions

    @property
    def per_session_kib(self) -> float:
        return (self.rss_after_mib - self.rss_before_mib) * 1024 / max(self.sessions, 1)


def rss_mib(status: str) -> float:
    """``VmRSS`` of a ``/proc/<pid>/status`` text, in MiB."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError("no VmRSS line")


def _own_rss() -> float:
    gc.collect()
    return rss_mib(Path("/proc/self/status").read_text())


def measure(state_dir: Path, sessions: int = 100, turns: int = 5) -> MemorySample:
    state_dir.mkdir(parents=True, exist_ok=True)
    tools = state_dir / "tools.json"
    tools.write_text(
        '[{"type":"function","function":{"name":"read_file","description":"Read a file.",'
        '"parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]'
    )
    runtime = Runtime.open(
        load_settings(
            state_dir=state_dir,
            tools_file=tools,
            infer_url=f"unix:{state_dir / 'no-server.sock'}",
            model="none",  # no request is sent
            broker_url=f"unix:{state_dir / 'no-broker.sock'}",
        )
    )
    before = _own_rss()
    for index in range(sessions):
        name = f"idle-{index}"
        session = runtime.ensure_session(name)
        epoch = runtime.log.current_epoch(name)
        with runtime.log.transaction():
            for turn in range(turns):
                runtime.log.append_user(name, f"question {turn}", external_key=f"{name}-{turn}")
                record = RequestRecord(RequestKind.TURN, session.slot, epoch.number, 2, "0" * 64)
                runtime.log.append_assistant(name, _ANSWER, request=record)
        runtime.log.state(name)
    after = _own_rss()
    anyio.run(runtime.aclose)
    return MemorySample(sessions, before, after)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or (len(argv) == 2 and not argv[1].isdigit()):
        sys.stderr.write("usage: python -m bench.memory STATE_DIR [SESSIONS]\n")
        return 2
    sessions = int(argv[1]) if len(argv) == 2 else 100
    sys.stdout.write(json.dumps(asdict(measure(Path(argv[0]), sessions))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
