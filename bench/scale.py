"""The scale section of ``make bench``: loopd's own cost as a session's log grows.

A team's threads live for months, so what one request costs must not grow with everything the
session ever logged. Measured here, without a model (no figure depends on a model's speed):

- **Per request**: loopd's CPU for one request of a turn outside the server's stream, on sessions
  whose log holds each size of ``SIZES``: the whole turn path (the context gate, the log reads, the
  request build, the body's encoding, the digest, the cache-loss bookkeeping, the appends), with
  the stream replaced by a recorded one (``tests/data/streams``; its decoding is counted, and it
  is the same at every size). Cold: the first turn on a log just opened; warm: the turns after.
- **Reads**: the session-log reads a turn and the chat layer make, one by one.
- **Filling**: CPU per entry appended, at the start of the log and at its end (flat = linear).
- **Start**: the session-state reads ``loopd serve`` makes before it takes messages, on
  ``START_SESSIONS`` sessions of ``START_TURNS`` turns each.
- **Disk**: the file's bytes per 1,000 turns (plain, and with one tool round each), with the page
  space it holds unused.
- **Per token**: loopd's CPU per generated token on the turn path a thread uses, against a bare
  ``httpx.AsyncClient`` reading the same request's stream, as it comes and on loopd's transport
  (``loopcommon.transport``), from the fake llama-server in its own process (only the client's CPU
  is counted, and that is the same whatever serves the stream).

Every session's log is a real one: turns of a user message, an assistant message that calls a
tool, the tool's result and the answer, with a request record for each assistant message, and a
new epoch every ``EPOCH_ENTRIES`` entries (what compaction bounds an epoch to). ``python -m
bench.scale`` prints the figures beside a recorded earlier run (``--before``) and can record its
own (``--save``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

from loopcommon.transport import AsyncioTransport
from loopd.approvals.call import Asker
from loopd.contextwindow.budget import ServerBudget
from loopd.contextwindow.compaction import Compactor
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.outcome import RequestResult
from loopd.engine.progress import Status
from loopd.engine.request import RequestSettings, build_body
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog
from loopd.tools.core import ToolResult
from loopd.turn.loop import Turn
from loopd.wire.assemble import ToolCall
from loopd.wire.events import EventDecoder

SIZES = (1_000, 10_000, 50_000)
EPOCH_ENTRIES = 400
START_SESSIONS = 1_000
START_TURNS = 50
TOKENS = (500, 2_000, 8_000)
WARM_TURNS = 5
RESULTS = Path(__file__).resolve().parent / "results"
BEFORE = RESULTS / "scale-before.json"
STREAMS = Path(__file__).resolve().parent.parent / "tests" / "data" / "streams"
COMMAND = "python -m bench.scale"

_TOOLS = '[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]'
_SYSTEM = "You are a helpful assistant in a team's chat."
_CALL = (
    '{"role":"assistant","content":"","tool_calls":[{"id":"call_%d","type":"function",'
    '"function":{"name":"read_file","arguments":"{\\"path\\": \\"src/main.py\\"}"}}]}'
)
_ANSWER = '{"role":"assistant","content":"Done: the file has %d lines, all of them fine."}'
MODEL = "fake-model"


# -- filling a log -------------------------------------------------------------------------------


def _record(epoch: int, count: int) -> RequestRecord:
    perf = Perf(outcome="complete", cache_n=count * 20, prompt_n=30, predicted_n=12, capped=False)
    return RequestRecord(RequestKind.TURN, 0, epoch, count, "0" * 64, perf=perf)


def new_session(log: SessionLog, name: str) -> None:
    log.ensure_session(name, 0)
    log.start_epoch(name, reason="bench", tools_text=_TOOLS, system_text=_SYSTEM)


def add_turn(log: SessionLog, name: str, index: int, *, tools: bool) -> int:
    """One turn of the session (4 entries with a tool round, else 2); a new epoch first when the
    current one holds ``EPOCH_ENTRIES``. The entries it appended."""
    epoch = log.current_epoch(name)
    log.append_user(
        name, f"@ana: question {index}, about src/main.py ✓", external_key=f"{name}-{index}"
    )
    if tools:
        log.append_assistant(name, _CALL % index, request=_record(epoch.number, 2))
        log.append_tool_result(name, tool_call_id=f"call_{index}", content="42 lines\n" * 4)
    log.append_assistant(name, _ANSWER % index, request=_record(epoch.number, 4))
    return 4 if tools else 2


def fill(log: SessionLog, name: str, entries: int, *, tools: bool = True) -> list[float]:
    """Fill the session to ``entries`` entries; CPU seconds per entry of each 1,000 appended.

    Appends go in transactions of 100 turns: what is measured is loopd's work per entry, not
    the disk's fsync (each turn of the daemon is its own transaction)."""
    new_session(log, name)
    count, index, marks = 2, 0, []  # the epoch entry and the session's first
    started, at = time.process_time(), 0
    while count < entries:
        with log.transaction():
            for _ in range(100):
                if count >= entries:
                    break
                if count % EPOCH_ENTRIES < 4 and count > 4:
                    log.start_epoch(name, reason="bench", tools_text=_TOOLS, system_text=_SYSTEM)
                    count += 1
                count += add_turn(log, name, index, tools=tools)
                index += 1
                if count - at >= 1000:
                    now = time.process_time()
                    marks.append((now - started) / (count - at))
                    started, at = now, count
    return marks


# -- the turn path, with the stream replaced -----------------------------------------------------


class _Tools:
    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult:
        return ToolResult("42 lines\n" * 4, ok=True)


def _canned_stream(streams: Iterator[bytes]) -> Callable[..., Awaitable[None]]:
    async def stream_into(result: RequestResult, *args: Any, **kwargs: Any) -> None:
        decoder = EventDecoder()
        result.assembler.apply_all([*decoder.feed(next(streams)), *decoder.flush()])
        result.first_byte_s = 0.001

    return stream_into


def thread_turn(log: SessionLog, name: str, client: InferenceClient, report: Any = None) -> Turn:
    settings = RequestSettings(model=MODEL, slot=0, max_tokens=8192 + 512)
    return Turn(
        session=name,
        slot=0,
        client=client,
        log=log,
        settings=settings,
        limits=Limits(),
        tools=_Tools(),
        gate=Compactor(ServerBudget(client, n_ctx=1 << 20)),
        report=report if report is not None else (lambda status: None),
    )


async def _per_request(path: Path, name: str, turns: int) -> tuple[float, float]:
    """CPU ms per request: of the first turn on a log just opened, and of the next ``turns``."""
    tool, plain = (STREAMS / "tool_call.sse").read_bytes(), (STREAMS / "plain.sse").read_bytes()

    def cycle() -> Iterator[bytes]:
        while True:
            yield tool
            yield plain

    client = InferenceClient("http://127.0.0.1:9", MODEL)  # never reached: the stream is canned
    per_turn: list[float] = []
    with (
        SessionLog.open(path) as log,
        mock.patch("loopd.turn.loop.stream_into", _canned_stream(cycle())),
    ):
        for index in range(turns + 1):
            started = time.process_time()
            log.append_user(name, f"@ana: one more, {index}", external_key=f"more-{index}")
            outcome = await thread_turn(log, name, client).run()
            per_turn.append((time.process_time() - started) * 1000 / len(outcome.requests))
            if outcome.answer is None:
                raise RuntimeError(f"the canned turn did not answer: {outcome.failure}")
    await client.aclose()
    return per_turn[0], statistics.median(per_turn[1:])


def _timed(fn: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.process_time()
        fn()
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def _reads(path: Path, name: str) -> dict[str, float]:
    """ms per call of the reads on a turn's path, each on a log just opened (no cache)."""
    from loopd.chat import threads

    thread_entries = getattr(threads, "thread_entries", None)
    found: dict[str, float] = {}
    with SessionLog.open(path) as log:
        found["requests()"] = _timed(lambda: log.requests(name))
        found["entries()"] = _timed(lambda: log.entries(name))
        found["state()"] = _timed(lambda: log.state(name))
        if hasattr(log, "latest_request"):
            found["latest_request()"] = _timed(lambda: log.latest_request(name))
        if hasattr(log, "epoch_entries"):
            epoch = log.current_epoch(name).number
            found["epoch_entries()"] = _timed(lambda: log.epoch_entries(name, epoch))
        if thread_entries is not None:
            found["chat: thread_entries()"] = _timed(lambda: thread_entries(log, name))
    with SessionLog.open(path) as log:
        found["replay build, cold"] = _timed(
            lambda: build_body(
                RequestSettings(model=MODEL, slot=0, max_tokens=512),
                _TOOLS,
                log.replay_messages(name),
            ),
            repeats=1,
        )
    return found


def measure_sizes(work: Path, sizes: Sequence[int]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for size in sizes:
        path = work / f"scale-{size}.db"
        name = f"thread-{size}"
        with SessionLog.open(path) as log:
            started = time.perf_counter()
            marks = fill(log, name, size)
            fill_s = time.perf_counter() - started
        cold, warm = asyncio.run(_per_request(path, name, WARM_TURNS))
        rows[str(size)] = {
            "request_cold_ms": cold,
            "request_warm_ms": warm,
            "fill_first_us": marks[0] * 1e6 if marks else None,
            "fill_last_us": marks[-1] * 1e6 if marks else None,
            "fill_s": fill_s,
            "reads_ms": _reads(path, name),
        }
        path.unlink()
    return rows


# -- loopd serve's start -------------------------------------------------------------------------


def measure_start(work: Path, sessions: int, turns: int) -> dict[str, Any]:
    """The reads ``loopd serve`` makes at start (``SessionRuntime``'s restart wants, the
    endpoints' placement, the chat layer's resume of every thread) on plain turns."""
    from loopd.chat import threads

    path = work / "start.db"
    started = time.perf_counter()
    with SessionLog.open(path) as log:
        for number in range(sessions):
            name = f"thread-{number}"
            with log.transaction():
                new_session(log, name)
                for index in range(turns):
                    add_turn(log, name, index, tools=False)
    fill_s = time.perf_counter() - started
    chat_reads = getattr(threads, "thread_entries", None) or (lambda log, name: log.entries(name))
    started, cpu = time.perf_counter(), time.process_time()
    with SessionLog.open(path) as log:
        names = [s.name for s in log.sessions()]
        for name in names:  # SessionRuntime: which sessions have a turn to resume
            log.state(name)
        log.last_answered()
        log.last_endpoints()
        log.endpoint_slots()
        for name in names:  # the chat layer's resume: deliver, state, tidy
            chat_reads(log, name)
            log.state(name)
            chat_reads(log, name)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    path.unlink()
    return {
        "sessions": sessions,
        "turns": turns,
        "start_s": wall,
        "start_cpu_s": cpu,
        "fill_s": fill_s,
    }


# -- disk ----------------------------------------------------------------------------------------


def measure_disk(work: Path, turns: int = 1_000) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for tools in (False, True):
        path = work / f"disk-{tools}.db"
        with SessionLog.open(path) as log:
            new_session(log, "thread")
            with log.transaction():
                for index in range(turns):
                    add_turn(log, "thread", index, tools=tools)
        # SQLite's own page counters, read beside the log (closed, so its WAL is checkpointed).
        with closing(sqlite3.connect(path)) as conn:
            pages, size = (
                conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "page_size")
            )
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            try:
                unused = conn.execute("SELECT sum(unused) FROM dbstat").fetchone()[0]
            except sqlite3.OperationalError:  # dbstat is a compile-time option of SQLite
                unused = None
        found["with tools" if tools else "plain"] = {
            "bytes": pages * size,
            "free_bytes": free * size,
            "unused_in_pages": unused,
        }
        path.unlink()
    return found


# -- CPU per generated token ---------------------------------------------------------------------


@contextmanager
def fake_server(work: Path) -> Iterator[Path]:
    sock = work / "fake.sock"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loopd_dev.fakes.llama",
            "--uds",
            str(sock),
            "--single",
            "--model",
            MODEL,
            "--ctx-size",
            "65536",
            "--slots",
            "1",
            "--tokens-per-second",
            "4000",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line.startswith("listening"):
            raise RuntimeError(f"the fake llama-server did not start: {line!r}")
        yield sock
    finally:
        child.terminate()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def _word(i: int) -> str:
    """One token of the fake's tokenizer (letters only: a word with digits is two)."""
    return "w" + chr(ord("a") + i % 26) + chr(ord("a") + i // 26 % 26)


def script_answer(http: httpx.Client, tokens: int) -> None:
    words = " ".join(_word(i) for i in range(tokens - 1))  # and the end-of-turn token
    http.post("/_fake/script", json={"replies": [{"content": words}]}).raise_for_status()


async def _loopd_tokens(sock: Path, log: SessionLog, name: str, tokens: int) -> float:
    client = InferenceClient(f"unix:{sock}", MODEL)
    shown: list[Status] = []
    turn = thread_turn(log, name, client, report=shown.append)  # a thread shows each status it gets
    log.append_user(name, "@ana: write it all out", external_key=f"tokens-{tokens}-{time.time()}")
    started = time.process_time()
    outcome = await turn.run()
    cpu = time.process_time() - started
    await client.aclose()
    predicted = outcome.requests[-1].perf.predicted_n or 0
    # Both clients' CPU is divided by ``tokens``: the stream must hold that many.
    if outcome.answer is None or abs(predicted - tokens) > tokens * 0.01:
        raise RuntimeError(
            f"the fake's answer was {predicted} tokens, not {tokens} ({outcome.failure})"
        )
    return cpu * 1000 / predicted


async def _bare_tokens(sock: Path, body: bytes, tokens: int, *, asyncio_streams: bool) -> float:
    """CPU ms per token of a client that only reads the stream: httpx as it comes, or on loopd's
    transport (asyncio's own streams, ``loopcommon.transport``)."""
    transport = (
        AsyncioTransport(limits=httpx.Limits(), uds=str(sock))
        if asyncio_streams
        else httpx.AsyncHTTPTransport(uds=str(sock))
    )
    # No timeouts, as loopd's own client reads a stream (httpx's read timeout is a cancel scope
    # per read): the least a client reading it in Python costs.
    async with httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=None) as http:
        started = time.process_time()
        async with http.stream("POST", "/v1/chat/completions", content=body) as answer:
            async for _ in answer.aiter_raw():
                pass
        cpu = time.process_time() - started
    return cpu * 1000 / tokens


# One stream's CPU varies by a fifth from run to run on a shared machine: the median of five
# interleaved runs of each client.
TOKEN_REPEATS = 5


def measure_tokens(
    work: Path, counts: Sequence[int], repeats: int = TOKEN_REPEATS
) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with fake_server(work) as sock:
        control = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://fake")
        path = work / "tokens.db"
        with SessionLog.open(path) as log:
            new_session(log, "thread")
            for tokens in counts:
                loopd_ms: list[float] = []
                bare_ms: list[float] = []
                bare_asyncio_ms: list[float] = []
                for _ in range(repeats):
                    script_answer(control, tokens)
                    loopd_ms.append(asyncio.run(_loopd_tokens(sock, log, "thread", tokens)))
                    body = build_body(
                        RequestSettings(model=MODEL, slot=0, max_tokens=tokens + 512),
                        _TOOLS,
                        log.replay_messages("thread"),
                    )
                    for ms, asyncio_streams in ((bare_ms, False), (bare_asyncio_ms, True)):
                        script_answer(control, tokens)
                        ms.append(
                            asyncio.run(
                                _bare_tokens(sock, body, tokens, asyncio_streams=asyncio_streams)
                            )
                        )
                found[str(tokens)] = {
                    "loopd_ms": statistics.median(loopd_ms),
                    "bare_ms": statistics.median(bare_ms),
                    "bare_asyncio_ms": statistics.median(bare_asyncio_ms),
                }
        control.close()
    return found


# -- the whole section ---------------------------------------------------------------------------


def measure(
    sizes: Sequence[int] = SIZES,
    tokens: Sequence[int] = TOKENS,
    start: tuple[int, int] = (START_SESSIONS, START_TURNS),
    *,
    command: str = COMMAND,
    label: str = "",
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        work = Path(tmp)
        return {
            "label": label,
            "command": command,
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "load": os.getloadavg()[0],
            "sizes": measure_sizes(work, sizes) if sizes else {},
            "start": measure_start(work, *start) if start[0] else None,
            "disk": measure_disk(work),
            "tokens": measure_tokens(work, tokens) if tokens else {},
        }


def _ratio(row: dict[str, Any] | None, key: str) -> str:
    """loopd's CPU per token over ``key``'s, or ``-`` where that was not measured."""
    if row is None or row.get(key) is None:
        return "-"
    return f"{row['loopd_ms'] / row[key]:.2f}"


def _cell(row: dict[str, Any] | None, key: str, digits: int = 2) -> str:
    value = None if row is None else row.get(key)
    return "-" if value is None else f"{value:,.{digits}f}"


def render(after: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
    """The section as Markdown: each figure of ``after`` beside ``before``'s (``-`` where that
    run did not measure it)."""
    b = before or {}
    lines = ["## Scale: loopd's own cost as a thread's log grows", ""]
    for run, what in ((b, "before"), (after, "after")):
        if run:
            lines.append(
                f"- {what}: `{run['command']}`, {run['when']} ({run['label'] or 'this tree'}), "
                f"load {run['load']:.2f}"
            )
    lines += [
        "",
        "| Log entries | CPU ms per request, cold (before / after) | warm | "
        "filling µs per entry, first 1,000 | last 1,000 |",
        "|---|---|---|---|---|",
    ]
    sizes = sorted({*after["sizes"], *b.get("sizes", {})}, key=int)
    for size in sizes:
        x, y = b.get("sizes", {}).get(size), after["sizes"].get(size)
        lines.append(
            f"| {int(size):,} | {_cell(x, 'request_cold_ms')} / {_cell(y, 'request_cold_ms')} | "
            f"{_cell(x, 'request_warm_ms')} / {_cell(y, 'request_warm_ms')} | "
            f"{_cell(x, 'fill_first_us', 0)} / {_cell(y, 'fill_first_us', 0)} | "
            f"{_cell(x, 'fill_last_us', 0)} / {_cell(y, 'fill_last_us', 0)} |"
        )
    reads = sorted(
        {k for run in (b, after) for r in run.get("sizes", {}).values() for k in r["reads_ms"]}
    )
    lines += ["", "Reads, ms per call on a log just opened (before / after):", ""]
    lines += [
        "| Read | " + " | ".join(f"{int(s):,}" for s in sizes) + " |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    for read in reads:
        cells = []
        for size in sizes:
            x = b.get("sizes", {}).get(size, {}).get("reads_ms", {})
            y = after["sizes"].get(size, {}).get("reads_ms", {})
            cells.append(f"{_cell(x, read)} / {_cell(y, read)}")
        lines.append(f"| `{read}` | " + " | ".join(cells) + " |")
    lines += ["", "| `loopd serve` start reads | before | after |", "|---|---|---|"]
    xs, ys = b.get("start"), after.get("start")
    shape = ys or xs or {}
    lines.append(
        f"| {shape.get('sessions', 0):,} sessions of {shape.get('turns', 0)} turns, s (CPU s) | "
        f"{_cell(xs, 'start_s')} ({_cell(xs, 'start_cpu_s')}) | "
        f"{_cell(ys, 'start_s')} ({_cell(ys, 'start_cpu_s')}) |"
    )
    lines += [
        "",
        "| Disk per 1,000 turns | before: bytes (free pages, unused in pages) | after |",
        "|---|---|---|",
    ]
    for kind in after["disk"]:
        cells = []
        for run in (b, after):
            d = run.get("disk", {}).get(kind)
            cells.append(
                "-"
                if d is None
                else f"{d['bytes']:,} ({d['free_bytes']:,}, {d['unused_in_pages'] or 0:,})"
            )
        lines.append(f"| {kind} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "| Tokens | loopd CPU ms per token (before / after) | bare httpx | ratio | "
        "bare httpx on loopd's transport | loopd / that |",
        "|---|---|---|---|---|---|",
    ]
    for tokens in sorted({*after["tokens"], *b.get("tokens", {})}, key=int):
        x, y = b.get("tokens", {}).get(tokens), after["tokens"].get(tokens)
        ratios = [_ratio(r, "bare_ms") for r in (x, y)]
        lines.append(
            f"| {int(tokens):,} | {_cell(x, 'loopd_ms', 3)} / {_cell(y, 'loopd_ms', 3)} | "
            f"{_cell(x, 'bare_ms', 3)} / {_cell(y, 'bare_ms', 3)} | {ratios[0]} / {ratios[1]} | "
            f"{_cell(y, 'bare_asyncio_ms', 3)} | {_ratio(y, 'bare_asyncio_ms')} |"
        )
    lines += [
        "",
        "Each client reads the same stream of exactly that many tokens (one a word). bare httpx "
        "is an `httpx.AsyncClient` as it comes; loopd reads through its own transport "
        "(`loopcommon/transport.py`: httpx on asyncio's streams), and the last two columns set it "
        "against a bare client on that transport: what loopd's decoding, assembling and limits "
        "cost above reading the bytes. The recorded before run's words were two tokens each "
        "(8,704 at most), and its bare-client CPU was divided by the words, loopd's by the "
        "tokens: its ratios read low (about half at 500 and 2,000).",
    ]
    return lines


def before(path: Path = BEFORE) -> dict[str, Any] | None:
    """The recorded run of the code before this section's changes, if there is one."""
    if not path.exists():
        return None
    found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument(
        "--start", default=f"{START_SESSIONS}x{START_TURNS}", help="SESSIONSxTURNS; 0x0: none"
    )
    parser.add_argument("--before", type=Path, default=BEFORE, help="an earlier run to show beside")
    parser.add_argument("--save", type=Path, help="record this run here (JSON)")
    parser.add_argument("--label", default="", help="what this run measured (a commit)")
    args = parser.parse_args(argv)
    given = " ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)])
    sessions, turns = (int(n) for n in args.start.split("x"))
    found = measure(
        [int(s) for s in args.sizes.split(",") if s],
        [int(t) for t in args.tokens.split(",") if t],
        (sessions, turns),
        command=given,
        label=args.label,
    )
    if args.save:
        args.save.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    print("\n".join(render(found, before(args.before))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
