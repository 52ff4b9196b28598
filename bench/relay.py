"""The relay section of ``make bench``: brokerd's CPU per 1,000 streamed tokens beside loopd's.

In the box, loopd reads every streamed answer through brokerd's inference proxy (``infer.sock``),
so each token costs CPU in both daemons. Measured here: the fake llama-server in its own process
streaming 4,000 tokens a second (``bench.scale.fake_server``), a real ``brokerd serve --only
infer`` in front of it, and loopd's turn path (the one a thread uses) in this process reading
through brokerd's socket. brokerd's CPU is the kernel's accounting of its threads across each
stream (``/proc/PID/task/*/schedstat``), loopd's ``time.process_time`` across its turn; each the
median of ``repeats`` interleaved runs. Target: brokerd at most half of loopd.

``tree`` runs the brokerd of another checkout (its folder first on ``PYTHONPATH``: the recorded
"before" figures are the tree before this section's changes). ``beside`` runs another checkout's
brokerd in the same run, each of its streams between this one's: before and after a change to
brokerd, side by side on one machine's load.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Final

import httpx

from bench.errors import BenchError
from bench.scale import MODEL, fake_server, new_session, script_answer, thread_turn
from bench.startup import cpu_ns
from loopd.engine.client import InferenceClient
from loopd.sessionlog.store import SessionLog

TOKENS: Final = (500, 2_000, 8_000)
REPEATS: Final = 5


@contextmanager
def brokerd(work: Path, upstream: Path, tree: Path | None = None) -> Iterator[tuple[int, Path]]:
    """``brokerd serve --only infer`` in front of ``upstream``: its pid and its socket."""
    sockets = work / "brokerd"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BROKERD_SOCKET_DIR": str(sockets),
        "BROKERD_INFERENCE_URL": f"unix:{upstream}",
    }
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    log_path = work / "brokerd.log"
    with log_path.open("wb") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-m", "brokerd", "serve", "--only", "infer"],
            env=env,
            stdout=log_file,
            stderr=log_file,
            cwd=work,
        )
    try:
        deadline = time.monotonic() + 60
        while '"msg": "ready: ' not in log_path.read_text(errors="replace"):
            if child.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"brokerd did not start:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.05)
        yield child.pid, sockets / "infer.sock"
    finally:
        child.terminate()
        child.wait(timeout=15)


async def _through(
    sock: Path, log: SessionLog, name: str, tokens: int, pid: int
) -> tuple[float, float]:
    """One turn of ``tokens`` tokens read through ``sock``: loopd's and brokerd's CPU ms."""
    client = InferenceClient(f"unix:{sock}", MODEL)
    turn = thread_turn(log, name, client, report=lambda status: None)
    log.append_user(name, "@ana: write it all out", external_key=f"relay-{tokens}-{time.time()}")
    relay_before, started = cpu_ns(pid), time.process_time()
    outcome = await turn.run()
    loopd_s, relay_ns = time.process_time() - started, cpu_ns(pid) - relay_before
    await client.aclose()
    predicted = outcome.requests[-1].perf.predicted_n or 0
    if outcome.answer is None or abs(predicted - tokens) > tokens * 0.01:
        raise BenchError(f"the fake's answer was {predicted} tokens, not {tokens}")
    return loopd_s * 1e6 / predicted, relay_ns / 1e3 / predicted  # ms per 1,000 tokens


@contextmanager
def splice(work: Path, upstream: Path) -> Iterator[tuple[int, Path]]:
    """``bench.splice`` in front of ``upstream``: its pid and its socket."""
    sock = work / "splice.sock"
    argv = [sys.executable, "-m", "bench.splice", str(sock), str(upstream)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        if not child.stdout.readline().startswith("listening"):
            raise BenchError("the splice relay did not start")
        yield child.pid, sock
    finally:
        child.terminate()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


Relay = tuple[int, Path]
"""A relay's pid and its socket."""


def measure(
    work: Path,
    counts: Sequence[int] = TOKENS,
    repeats: int = REPEATS,
    tree: Path | None = None,
    beside: Path | None = None,
) -> dict[str, Any]:
    (work / "before").mkdir()
    with fake_server(work) as upstream:
        other: AbstractContextManager[Relay | None] = (
            brokerd(work / "before", upstream, beside) if beside else nullcontext()
        )
        with (
            brokerd(work, upstream, tree) as this,
            other as before,
            splice(work, upstream) as floor,
        ):
            relays = {"brokerd": this, "splice": floor}
            if before is not None:
                relays["before"] = before
            found = _streams(work, upstream, counts, repeats, relays)
    rows: dict[str, Any] = {}
    for tokens, by_relay in found.items():
        this_one = by_relay["brokerd"]
        rows[tokens] = {
            "loopd_ms": this_one["loopd_ms"],
            "brokerd_ms": this_one["relay_ms"],
            "splice_ms": by_relay["splice"]["relay_ms"],
        }
        if "before" in by_relay:
            earlier = by_relay["before"]
            rows[tokens]["before"] = {
                "loopd_ms": earlier["loopd_ms"],
                "brokerd_ms": earlier["relay_ms"],
            }
    return {
        "tree": str(tree) if tree else "",
        "beside": str(beside) if beside else "",
        "repeats": repeats,
        "rows": rows,
    }


def _streams(
    work: Path,
    upstream: Path,
    counts: Sequence[int],
    repeats: int,
    relays: dict[str, Relay],
) -> dict[str, Any]:
    """Per length: each relay's median CPU (brokerd's, loopd's) per 1,000 tokens, its streams
    interleaved with the other relays'."""
    rows: dict[str, Any] = {}
    control = httpx.Client(transport=httpx.HTTPTransport(uds=str(upstream)), base_url="http://f")
    with control, SessionLog.open(work / "relay.db") as log:
        for tokens in counts:
            found: dict[str, list[tuple[float, float]]] = {name: [] for name in relays}
            for name in relays:  # a session for each relay and length: the prompt grows
                new_session(log, f"{name}-{tokens}")
            for _ in range(repeats):
                for name, (pid, sock) in relays.items():
                    script_answer(control, tokens)
                    run = asyncio.run(_through(sock, log, f"{name}-{tokens}", tokens, pid))
                    found[name].append(run)
            rows[str(tokens)] = {
                name: {
                    "loopd_ms": statistics.median(loopd for loopd, _ in runs),
                    "relay_ms": statistics.median(relay for _, relay in runs),
                }
                for name, runs in found.items()
            }
    return rows


def render(after: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
    """The section; "before" columns from the run itself when it measured a tree beside this
    one (``beside``), else from ``before`` (a recorded run), if given."""
    lines = [
        "### Relay: brokerd's CPU per 1,000 streamed tokens",
        "",
        "loopd's turn path reads the fake llama-server's stream (4,000 tokens a second, its own "
        "process) through a real `brokerd serve --only infer`; CPU per 1,000 tokens, each the "
        f"median of {after['repeats']} runs: brokerd's from the kernel's accounting of its "
        "threads, loopd's from its process time. Target: brokerd at most half of loopd. Beside "
        "it, the floor of any relay on asyncio: a byte splice that parses and checks nothing "
        "(`bench/splice.py`), read through by the same turn path in the same run.",
        "",
    ]
    earlier_rows: dict[str, Any] | None
    if after.get("beside"):
        lines[-2] += (
            f" Before: the brokerd of `{after['beside']}` (the tree before the change), in the "
            "same run, each of its streams between this brokerd's and the splice's; its ratio "
            "is to loopd's CPU in its own turns."
        )
        earlier_rows = {tokens: row["before"] for tokens, row in after["rows"].items()}
    else:
        earlier_rows = before["rows"] if before is not None else None
    head = "| tokens | loopd ms | brokerd ms | brokerd / loopd | splice ms | splice / loopd |"
    rule = "|---|---|---|---|---|---|"
    if earlier_rows is not None:
        head += " brokerd ms before | brokerd / loopd before |"
        rule += "---|---|"
    lines += [head, rule]
    for tokens, row in after["rows"].items():
        cells = [f"{int(tokens):,}", _ms(row["loopd_ms"]), _ms(row["brokerd_ms"]), _ratio(row)]
        cells += [_ms(row["splice_ms"]), _ratio(row, "splice_ms")]
        if earlier_rows is not None:
            earlier = earlier_rows.get(tokens)
            cells += [_ms(earlier["brokerd_ms"]), _ratio(earlier)] if earlier else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ms(value: float) -> str:
    return f"{value:,.0f}"


def _ratio(row: dict[str, float], relay: str = "brokerd_ms") -> str:
    return f"{row[relay] / row['loopd_ms']:.2f}"
