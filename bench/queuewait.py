"""The queue scenario of ``make bench``: does the wait loopd records add up to the one people saw?

Two scenarios on the fake llama-server (in this process, generating 50 tokens a second), each run
through loopd's runtime as a front end runs a turn:

- **behind another thread in loopd**: two sessions on one lane; the second asks for its slot while
  the first has 80 tokens to go, and waits in loopd's own queue;
- **behind another client on the server**: a server of one slot, which another client's request
  holds for 80 tokens; loopd's turn waits in the server's queue.

The wait measured from outside is from the moment the bench asks for the turn to the moment the
turn's first token shows (its status callback); the recorded wait is the sum of the parts in the
turn's perf record (``loopd.engine.waits``). Run against a tree from before those parts existed
(``python -m bench.queuewait --json`` with that tree first on ``PYTHONPATH``), the record shows
what it had: the time to first byte and the server-queue figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import httpx

from loopd.config import load_settings
from loopd.engine.progress import Phase, Status
from loopd.sessionlog.records import Request, fresh_external_key
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, ScriptedReply, serve_fake_llama

MODEL: Final = "fake-model"
TOKENS_PER_S: Final = 50.0
AHEAD_TOKENS: Final = 80  # what the turn ahead, or the other client, still has to generate
PARTS: Final = ("loopd_queue_ms", "server_queue_ms", "prompt_read_ms", "first_token_ms")
# What a record from before the parts existed had instead.
OLD_FIELDS: Final = ("ttfb_ms", "queue_wait_ms")


class FirstToken:
    """A status callback noting when the turn's first generated token shows."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.seen = anyio.Event()

    def __call__(self, status: Status) -> None:
        if self.at is None and status.phase in (Phase.THINKING, Phase.ANSWERING, Phase.TOOL_CALL):
            self.at = time.monotonic()
            self.seen.set()


def _words(n: int) -> str:
    return " ".join(f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(n))


def _runtime(sock: Path, state: Path) -> Runtime:
    settings = load_settings(
        infer_url=f"unix:{sock}",
        model=MODEL,
        broker_url=f"unix:{state / 'no-broker.sock'}",
        state_dir=state,
        slots=[0],
        think_cap=0,
    )
    return Runtime.open(settings)


async def behind_a_thread(work: Path) -> dict[str, Any]:
    fake = FakeLlama([ModelSpec(MODEL)], pace=Pace(tokens_per_second=TOKENS_PER_S))
    fake.push(ScriptedReply(content=_words(AHEAD_TOKENS + 1)), ScriptedReply(content="ok"))
    async with serve_fake_llama(fake, uds=work / "a.sock") as running:
        assert running.uds is not None
        runtime = _runtime(running.uds, work / "state-a")
        try:
            ahead, mine = runtime.ensure_session("ahead"), runtime.ensure_session("mine")
            for name in ("ahead", "mine"):
                runtime.log.append_user(name, "hi", external_key=fresh_external_key())
            ahead_shown, shown = FirstToken(), FirstToken()
            async with anyio.create_task_group() as tg:
                tg.start_soon(runtime.run_turn, ahead, ahead_shown)
                await ahead_shown.seen.wait()
                asked = time.monotonic()
                await runtime.run_turn(mine, shown)
            return _row(
                "behind another thread in loopd", asked, shown, runtime.log.requests("mine")
            )
        finally:
            await runtime.aclose()


async def behind_a_client(work: Path) -> dict[str, Any]:
    fake = FakeLlama([ModelSpec(MODEL, n_slots=1)], pace=Pace(tokens_per_second=TOKENS_PER_S))
    fake.push(ScriptedReply(content=_words(AHEAD_TOKENS + 1)), ScriptedReply(content="ok"))
    async with serve_fake_llama(fake, uds=work / "b.sock") as running:
        assert running.uds is not None
        runtime = _runtime(running.uds, work / "state-b")
        transport = httpx.AsyncHTTPTransport(uds=str(running.uds))
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}
        try:
            mine = runtime.ensure_session("mine")
            runtime.log.append_user("mine", "hi", external_key=fresh_external_key())
            shown = FirstToken()
            started = anyio.Event()

            async def another_client() -> None:
                async with (
                    httpx.AsyncClient(transport=transport, base_url="http://fake") as other,
                    other.stream("POST", "/v1/chat/completions", json=body) as answer,
                ):
                    async for line in answer.aiter_lines():
                        if '"content"' in line:
                            started.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(another_client)
                await started.wait()
                asked = time.monotonic()
                await runtime.run_turn(mine, shown)
            return _row(
                "behind another client on the server", asked, shown, runtime.log.requests("mine")
            )
        finally:
            await runtime.aclose()


def _row(
    scenario: str, asked: float, shown: FirstToken, requests: Sequence[Request]
) -> dict[str, Any]:
    if shown.at is None or not requests:
        raise RuntimeError(f"{scenario}: the turn showed no token")
    extra = requests[0].record.perf.extra
    perf = requests[0].record.perf
    recorded = {name: extra[name] for name in PARTS if name in extra}
    return {
        "scenario": scenario,
        "outside_ms": round((shown.at - asked) * 1000, 1),
        "parts": recorded,
        "recorded_ms": round(sum(recorded.values()), 1) if len(recorded) == len(PARTS) else None,
        "old": {name: getattr(perf, name) for name in OLD_FIELDS},
    }


async def _measure() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bq") as tmp:
        work = Path(tmp)
        return [await behind_a_thread(work), await behind_a_client(work)]


def measure() -> list[dict[str, Any]]:
    return anyio.run(_measure)


def render(
    rows: Sequence[dict[str, Any]], before: Sequence[dict[str, Any]] | None = None
) -> list[str]:
    lines = [
        "### The wait a person saw, recorded in parts",
        "",
        f"The fake llama-server generates {TOKENS_PER_S:.0f} tokens a second; the turn asks for "
        "its slot while the one ahead of it (another thread in loopd, or another client on a "
        f"server of one slot) has {AHEAD_TOKENS} tokens to go. Outside: from asking to the first "
        "token shown, on the bench's clock; recorded: the sum of the parts in the turn's perf "
        "record.",
        "",
        "| scenario | outside ms | recorded ms | difference | loopd's queue | server's queue "
        "| prompt read | first token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        parts = row["parts"]
        recorded = row["recorded_ms"]
        difference = (
            f"{(recorded - row['outside_ms']) / row['outside_ms']:+.1%}"
            if recorded
            else "not recorded"
        )
        cells = [
            row["scenario"],
            f"{row['outside_ms']:,.0f}",
            f"{recorded:,.0f}" if recorded else "-",
            difference,
            *(f"{parts[name]:,.0f}" if name in parts else "-" for name in PARTS),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if before:
        lines += [
            "",
            "Before (the same scenarios on the tree before the parts were recorded): what its "
            "record held for the same wait.",
            "",
            "| scenario | outside ms | time to first byte ms | server queue ms |",
            "|---|---|---|---|",
        ]
        for row in before:
            old = row["old"]
            cells = [row["scenario"], f"{row['outside_ms']:,.0f}"]
            cells += [f"{old[name]:,.0f}" if old[name] is not None else "-" for name in OLD_FIELDS]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queuewait", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = measure()
    print(json.dumps(rows, indent=1) if args.json else "\n".join(render(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
