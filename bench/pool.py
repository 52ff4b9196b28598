"""Pinning on a unified KV pool: does a session keep its cache when other sessions run?

Production serves four slots on one unified pool with the host prompt cache on
(docs/production-shape.md). This benchmark runs N sessions (2, 4, 6) in turn, each request with
a scripted reply (``max_tokens`` 1: the server reads the whole prompt, which is what is
measured, and the slot then holds exactly that prompt), in three ways of choosing slots:

- *pinned, own slots*: session i pinned to slot i mod 4 (loopd with ``LOOPD_SLOTS=0,1,2,3``);
- *pinned, one slot*: every session pinned to slot 0 (loopd with ``LOOPD_SLOTS=0``);
- *unpinned*: ``id_slot`` -1, the server picks the slot (by prompt similarity, else the least
  recently used one, restoring from the host cache);

the same three ways with four *young sessions sharing a system text* (their prompts begin with
the same system text, as loopd's share their system text and tools, and their own part is still
shorter than it); and a fourth scenario, *another client's long prompt*: one session, pinned to
slot 0 or unpinned, and between its turns another client's long, unrelated prompt (pinned to
slot 3, or unpinned).

Each runs on eight server layouts: the dense SmolLM2 and the hybrid ``qwen35moe``, each on a
unified pool as the server starts by default (``--kv-unified``, ``--cache-idle-slots`` on), on a
unified pool with ``--no-cache-idle-slots``, on one with ``--slot-prompt-similarity 0`` (the
server always takes the least recently used slot and consults the host cache), and on four slots
of their own (no ``--kv-unified``).
The server runs with ``-lv 4``; every request's cause is read from what the server logged for it
(``bench/serverlog.py``): which path chose the slot, whether the host cache restored a prompt,
which checkpoint a hybrid model resumed from, which idle slots a launch cleared.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.errors import BenchError
from bench.serverlog import LogFollower, ServerSteps, parse
from loopd_dev import devserver

log = logging.getLogger("bench.pool")

SLOTS = 4
ROUNDS = 3
SESSION_COUNTS = (2, 4, 6)
# Words of each session's first message and of another client's long prompt. SmolLM2 gets
# fewer: on a loaded 2-core machine it reads 5 to 40 tokens a second, the hybrid thousands.
WORDS = {"hybrid": (60, 400), "dense": (30, 100)}
# The *shared system text* scenarios: four young sessions whose prompts begin with the same
# system text (as loopd's sessions share their system text and tools) and whose own part is
# still shorter than it.
SHARED = ", shared system text"
SHARED_WORDS = {"hybrid": 150, "dense": 80}
OWN_WORDS = {"hybrid": 40, "dense": 20}
# Cache reuse within this many tokens of what the session left in the server counts as kept.
TOLERANCE = 2
# A hybrid model resumes at the checkpoint 4 tokens before the end of the previous prompt when
# the prompt diverges inside it (the prompt's last token tokenized anew, see bench/hybrid.py).
CHECKPOINT_BEFORE_END = 4
_VOCABULARY = (
    "build cache server slot thread prompt token reply parser release branch review test deploy "
    "metric latency budget queue worker schedule invoice customer ticket owner"
)
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class Layout:
    """One server layout: a model id of the benchmark's router and what it stands for."""

    name: str  # the model id
    model: str  # "dense" or "hybrid"
    flags: str  # for the report
    production_default: bool = False


def layouts_and_presets(prov: devserver.Provisioned) -> list[tuple[Layout, devserver.Preset]]:
    """The eight layouts as router presets. Both models use ChatML (no thinking): the replies are
    scripted, so only what the server keeps is measured. SmolLM2's pool is smaller (its KV cache
    takes about 23 KB a token; the hybrid's, with one attention layer, about 1 KB)."""
    chatml = (("chat-template", "chatml"),)
    no_idle = (("cache-idle-slots", "false"),)
    no_sim = (("slot-prompt-similarity", "0"),)
    out: list[tuple[Layout, devserver.Preset]] = []
    for model, label, pool in (("hybrid", "qwen35moe", 16384), ("dense", "smollm2", 8192)):
        unified = devserver.SlotLayout(ctx_size=pool, parallel=SLOTS, kv_unified=True)
        split = devserver.SlotLayout(ctx_size=pool, parallel=SLOTS, kv_unified=False)
        for suffix, flags, layout, extra, default in (
            ("unified", "--kv-unified (idle slots cached and cleared)", unified, (), True),
            ("unified-keep", "--kv-unified --no-cache-idle-slots", unified, no_idle, False),
            ("unified-lru", "--kv-unified --slot-prompt-similarity 0", unified, no_sim, False),
            ("split", "-np 4, no --kv-unified", split, (), False),
        ):
            name = f"pool-{label}-{suffix}"
            make = devserver.hybrid_preset if model == "hybrid" else devserver.dense_preset
            preset = make(prov, None, name=name, layout=layout, extra=chatml + extra)
            out.append((Layout(name, model, flags, default), preset))
    return out


@dataclass(frozen=True)
class PoolRequest:
    layout: str
    scenario: str
    sessions: int  # how many sessions take turns (1 for the long-prompt scenario)
    session: str
    round: int  # 1 = the session's first request
    slot_sent: int  # -1: unpinned
    slot_used: int | None  # from the server's log
    held: int  # prompt tokens the session left in the server with its previous request
    cache_n: int
    prompt_n: int
    cause: str
    other_client: bool = False  # the long prompt of another client, not a session's turn
    checkpoint: int | None = None  # the checkpoint a hybrid model resumed from, if any

    @property
    def kept(self) -> bool:
        return self.held > 0 and self.cache_n >= self.held - TOLERANCE

    @property
    def to_checkpoint(self) -> bool:
        """Kept up to the checkpoint just before the end of what the session left."""
        return (
            not self.kept
            and self.checkpoint == self.cache_n
            and self.cache_n >= self.held - CHECKPOINT_BEFORE_END
        )

    @property
    def lost(self) -> bool:
        return self.held > 0 and not self.kept and not self.to_checkpoint


def explain(
    steps: ServerSteps, held: int, cache_n: int, hybrid: bool, slot_held: str = "unknown"
) -> str:
    """Why this request reused ``cache_n`` of the ``held`` tokens its session left, from what the
    server logged. Every loss gets a cause; "unreadable" only when the log did not say.
    ``slot_held``: what the slot that ran it held before (``SlotOwners``): "own", "other"
    (another session's prompt), "empty" (cleared by a launch), or "unknown"."""
    if held == 0:
        return "first request"
    if not steps.readable:
        return "unreadable: the server's log had no lines for this request"
    lost = cache_n < held - CHECKPOINT_BEFORE_END
    if steps.cache_loaded and lost:
        where = "restored a prompt from the host cache that shares only part of this one"
    elif steps.cache_loaded:
        where = "restored from the host prompt cache"
    elif steps.pinned_slot_empty or (slot_held == "empty" and steps.selected_by == "id"):
        where = (
            "pinned slot empty: cleared when a task launched on another slot "
            "(--cache-idle-slots on a unified pool); a pinned request gets no restore"
        )
    elif slot_held == "other" and not steps.cache_updated:
        where = (
            "slot held another session's prompt sharing the system text: the server kept that "
            "shared part (half or more of the slot) and did not look in the host cache"
        )
    elif cache_n > TOLERANCE:
        where = "kept in its slot"
    elif steps.cache_updated:
        where = "slot held another prompt; the host cache had nothing better"
    else:
        where = "slot held another prompt"
    if steps.purged:
        where += f"; slots {sorted(steps.purged)} purged for room (not saved)"
    if hybrid and steps.checkpoint is not None and cache_n < held - TOLERANCE:
        where += (
            f"; resumed at the checkpoint at {steps.checkpoint} (recurrent state: the prompt "
            "diverged inside what the slot held)"
        )
    elif steps.full_reread and held > 0:
        where += "; no usable checkpoint: read again from the start"
    return where


class PoolRunner:
    """Sends the scenarios' requests to one router, reading the server's log after each."""

    def __init__(self, client: httpx.Client, follower: LogFollower) -> None:
        self.client = client
        self.follower = follower

    def send(
        self, model: str, messages: list[dict[str, str]], slot: int
    ) -> tuple[int, int, ServerSteps]:
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "cache_prompt": True,
            "id_slot": slot,
        }
        response = self._post(body)
        if response.status_code != 200:
            raise BenchError(f"{model}: {response.status_code} {response.text[:300]}")
        timings = response.json().get("timings") or {}
        steps = parse(self.follower.lines_until_release())
        return int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0)), steps

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        """The router sometimes closes a kept-alive connection after proxying a response, and
        the next request on it fails before reaching the server (loopd/selftest/probe.py has
        the measurement): that one is sent again, once."""
        for attempt in range(2):
            self.follower.mark()
            try:
                return self.client.post("/v1/chat/completions", json=body)
            except httpx.RemoteProtocolError as exc:
                if attempt:
                    raise BenchError(f"{body['model']}: request failed: {exc!r}") from exc
            except httpx.HTTPError as exc:
                raise BenchError(f"{body['model']}: request failed: {exc!r}") from exc
        raise AssertionError("unreachable")


def document(tag: str, words: int) -> str:
    rng = random.Random(tag)
    return f"Report {tag}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) + "."


class SlotOwners:
    """Whose prompt each slot holds, from the server's log: the session that ran there last,
    until a launch clears the slot."""

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}
        self.cleared: set[int] = set()

    def held(self, steps: ServerSteps, session: str) -> str:
        """What the slot that ran this request held before it ("own", "other", "empty",
        "unknown"); then record what the request did to the slots."""
        slot = steps.slot
        if slot is None:
            return "unknown"
        if steps.pinned_slot_empty or slot in self.cleared:
            before = "empty"
        elif slot in self.owner:
            before = "own" if self.owner[slot] == session else "other"
        else:
            before = "unknown"
        for other in (*steps.cleared, *steps.purged):
            self.owner.pop(other, None)
            self.cleared.add(other)
        self.owner[slot] = session
        self.cleared.discard(slot)
        return before


def turns(
    runner: PoolRunner,
    layout: Layout,
    scenario: str,
    count: int,
    slot_of: Callable[[int], int],
    words: int,
    system: str | None = None,
) -> list[PoolRequest]:
    """``count`` sessions taking turns for ``ROUNDS`` rounds, each pinned as ``slot_of`` says;
    with ``system``, every session's prompt begins with that same system text."""
    tag = f"{layout.name}/{scenario}/{count}"
    shared = [{"role": "system", "content": system}] if system else []
    conversations = [
        [*shared, {"role": "user", "content": document(f"{tag}/{i}", words) + " Summarise it."}]
        for i in range(count)
    ]
    held = [0] * count
    owners = SlotOwners()
    out = []
    for round_number in range(1, ROUNDS + 1):
        for i, messages in enumerate(conversations):
            cache_n, prompt_n, steps = runner.send(layout.name, messages, slot_of(i))
            slot_held = owners.held(steps, f"S{i}")
            out.append(
                PoolRequest(
                    layout=layout.name,
                    scenario=scenario,
                    sessions=count,
                    session=f"S{i}",
                    round=round_number,
                    slot_sent=slot_of(i),
                    slot_used=steps.slot,
                    held=held[i],
                    cache_n=cache_n,
                    prompt_n=prompt_n,
                    cause=explain(steps, held[i], cache_n, layout.model == "hybrid", slot_held),
                    checkpoint=steps.checkpoint,
                )
            )
            held[i] = cache_n + prompt_n
            messages += [
                {"role": "assistant", "content": f"Noted, session {i}, round {round_number}."},
                {"role": "user", "content": f"Next point, round {round_number}."},
            ]
    return out


def long_prompts(
    runner: PoolRunner,
    layout: Layout,
    session_slot: int,
    other_slot: int,
    words: int,
    other_words: int,
) -> list[PoolRequest]:
    """One session's turns with another client's long, unrelated prompt before each later one."""
    scenario = (
        f"long prompt between turns: session {_slot_text(session_slot)}, "
        f"other client {_slot_text(other_slot)}"
    )
    tag = f"{layout.name}/{scenario}"
    messages = [{"role": "user", "content": document(tag, words) + " Summarise it."}]
    held = 0
    out = []
    for round_number in range(1, ROUNDS + 1):
        if round_number > 1:
            other = [
                {"role": "user", "content": document(f"{tag}/other{round_number}", other_words)}
            ]
            cache_n, prompt_n, steps = runner.send(layout.name, other, other_slot)
            out.append(
                PoolRequest(
                    layout.name,
                    scenario,
                    1,
                    "other client",
                    round_number,
                    other_slot,
                    steps.slot,
                    0,
                    cache_n,
                    prompt_n,
                    "another client's long prompt",
                    other_client=True,
                )
            )
        cache_n, prompt_n, steps = runner.send(layout.name, messages, session_slot)
        out.append(
            PoolRequest(
                layout.name,
                scenario,
                1,
                "S0",
                round_number,
                session_slot,
                steps.slot,
                held,
                cache_n,
                prompt_n,
                explain(steps, held, cache_n, layout.model == "hybrid"),
                checkpoint=steps.checkpoint,
            )
        )
        held = cache_n + prompt_n
        messages += [
            {"role": "assistant", "content": f"Noted, round {round_number}."},
            {"role": "user", "content": f"Next point, round {round_number}."},
        ]
    return out


def _slot_text(slot: int) -> str:
    return "unpinned" if slot < 0 else f"on slot {slot}"


SCENARIOS: dict[str, Callable[[int], int]] = {
    "pinned, own slots": lambda i: i % SLOTS,
    "pinned, one slot": lambda i: 0,
    "unpinned": lambda i: -1,
}


def run_layout(
    runner: PoolRunner,
    layout: Layout,
    counts: Sequence[int] = SESSION_COUNTS,
    words: int = 60,
    other_words: int = 400,
) -> list[PoolRequest]:
    out: list[PoolRequest] = []
    for scenario, slot_of in SCENARIOS.items():
        for count in counts:
            out += turns(runner, layout, scenario, count, slot_of, words)
    system = "You are loopd. " + document("system text and tools", SHARED_WORDS[layout.model])
    for scenario, slot_of in SCENARIOS.items():
        shared = f"{scenario}{SHARED}"
        out += turns(runner, layout, shared, SLOTS, slot_of, OWN_WORDS[layout.model], system)
    for session_slot, other_slot in ((0, SLOTS - 1), (-1, -1)):
        out += long_prompts(runner, layout, session_slot, other_slot, words, other_words)
    log.info("pool: %s done, %d requests", layout.name, len(out))
    return out


@dataclass(frozen=True)
class PoolSummary:
    layout: str
    scenario: str
    sessions: int
    later: int  # a session's requests after its first
    kept: int
    to_checkpoint: int  # kept up to the checkpoint before the end (hybrid)
    lost: int
    held: int  # tokens the sessions had left in the server, summed over later requests
    reused: int  # their cache_n, summed
    causes: dict[str, int]  # the causes of the lost requests, most frequent first

    @property
    def reuse(self) -> float:
        return self.reused / max(self.held, 1)


def summarize(requests: Sequence[PoolRequest]) -> list[PoolSummary]:
    keys: list[tuple[str, str, int]] = []
    for r in requests:
        if (r.layout, r.scenario, r.sessions) not in keys:
            keys.append((r.layout, r.scenario, r.sessions))
    out = []
    for key in keys:
        later = [
            r
            for r in requests
            if (r.layout, r.scenario, r.sessions) == key and r.held > 0 and not r.other_client
        ]
        causes: dict[str, int] = {}
        for r in later:
            if r.lost:
                causes[short_cause(r.cause)] = causes.get(short_cause(r.cause), 0) + 1
        out.append(
            PoolSummary(
                *key,
                later=len(later),
                kept=sum(r.kept for r in later),
                to_checkpoint=sum(r.to_checkpoint for r in later),
                lost=sum(r.lost for r in later),
                held=sum(r.held for r in later),
                reused=sum(min(r.cache_n, r.held) for r in later),
                causes=dict(sorted(causes.items(), key=lambda item: -item[1])),
            )
        )
    return out


def short_cause(cause: str) -> str:
    """The cause up to its first clause, for counting."""
    return cause.split(":")[0].split(";")[0]


def start_server(workdir: Path, cache_dir: Path) -> tuple[devserver.RunningServer, list[Layout]]:
    """A router of its own with the eight layouts, logging at trace level."""
    prov = devserver.Provisioned.in_cache(cache_dir)
    pairs = layouts_and_presets(prov)
    server = devserver.start(
        workdir,
        cache_dir,
        socket_path=workdir / "llama.sock",
        layout=devserver.ServerLayout(models_max=len(pairs)),
        extra_args=("-lv", "4"),
        presets=tuple(preset for _, preset in pairs),
        load=tuple(layout.name for layout, _ in pairs),
    )
    return server, [layout for layout, _ in pairs]


def run(
    workdir: Path, cache_dir: Path, counts: Sequence[int] = SESSION_COUNTS
) -> tuple[list[Layout], list[PoolRequest]]:
    server, layouts = start_server(workdir, cache_dir)
    try:
        with server.client(timeout=300.0) as client:
            runner = PoolRunner(client, LogFollower(server.log_path))
            requests: list[PoolRequest] = []
            for layout in layouts:
                words, other_words = WORDS[layout.model]
                requests += run_layout(runner, layout, counts, words, other_words)
    finally:
        server.stop()
    return layouts, requests
