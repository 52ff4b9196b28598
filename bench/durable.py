"""Durable sessions: what a returning session re-reads after the server forgot it, with and
without a saved slot state.

One router of its own, started with ``--slot-save-path`` (on its command line, so every model's
child saves into the same folder), serving SmolLM2 (a pure transformer, two slots of their own)
and the hybrid ``qwen35moe`` preset (production's layout: four slots on one unified pool, the
host prompt cache). On each preset, sessions of different lengths each send a first request on
a slot of their own, and each slot's state is saved (``POST /slots/{id}?action=save``) under the
name loopd gives it (``loopcommon.slotfiles``). Then the server forgets, two ways: it is killed
(SIGKILL to the router and its children) and started again, or the router unloads the model and
loads it again. After each, every session returns with its next message (the previous one, a
scripted answer, a new question), twice: once without durable sessions (the request alone), and,
after the server forgot once more, once with them (``?action=restore`` of the saved file into
the session's slot, then the same request).

This drives the server's save and restore with raw HTTP calls: it measures what the server can
do; ``bench/durable_loopd.py`` measures loopd's own rule for when to save and restore.

- *ideal*: the new tokens, the returning prompt's tokens past what the first prompt shares with
  it (the server's own ``/tokenize`` of both prompts as the template renders them);
- *prompt_n/ideal*: ``prompt_n`` of the returning request over the ideal (the issue's
  loopd/ideal, for the server's own save and restore);
- *time to first token*: the returning request's wall time with ``max_tokens`` 1, plus the
  restore's wall time where there is one;
- *bytes per token*: each saved file's size over the tokens it holds; two lengths on each preset
  separate the state that grows with the prompt (the attention layers' KV) from the state of
  fixed size (the recurrent layers').
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.errors import BenchError
from bench.ideal import common_prefix
from loopcommon.slotfiles import slot_file_name
from loopd.engine.saverule import fit_size
from loopd_dev import devserver

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)

log = logging.getLogger("bench.durable")

PRESETS = (devserver.PLAIN_MODEL, devserver.HYBRID_MODEL)
# Two sessions per preset, each on a slot of its own, of different lengths (in paragraphs).
SESSION_PARAGRAPHS = (6, 14)
EVENTS = ("restart", "reload")
PARAGRAPH = (
    "Session {session}, note {n}: the release checklist lists the parser tests, the migration "
    "of the audit table, the new socket permissions and the rollback plan; each owner signs "
    "off in the thread before the deploy window opens on Thursday."
)

SCRIPTED_REASONING = "The user asked about the checklist."
SCRIPTED_ANSWER = "The checklist has four items; all owners have signed off."


@dataclass(frozen=True)
class Saved:
    preset: str
    session: str
    slot: int
    filename: str
    first_tokens: int
    ideal_new: int
    n_saved: int
    n_written: int
    save_ms: float


@dataclass(frozen=True)
class Return:
    preset: str
    event: str
    session: str
    durable: bool
    prompt_n: int
    cache_n: int
    ideal_new: int
    first_token_s: float
    restore_s: float = 0.0
    n_restored: int = 0

    @property
    def over_ideal(self) -> float:
        return self.prompt_n / max(self.ideal_new, 1)


@dataclass(frozen=True)
class Durable:
    saves: list[Saved]
    returns: list[Return]
    state_sizes: dict[str, tuple[float, float]]  # preset: (fixed bytes, bytes per token)


def first_messages(session: str, paragraphs: int) -> list[dict[str, Any]]:
    notes = " ".join(PARAGRAPH.format(session=session, n=n) for n in range(paragraphs))
    return [
        {"role": "system", "content": f"You answer questions about this thread. {notes}"},
        {"role": "user", "content": "What is on the release checklist?"},
    ]


def returning_messages(first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        *first,
        {
            "role": "assistant",
            "content": SCRIPTED_ANSWER,
            "reasoning_content": SCRIPTED_REASONING,
        },
        {"role": "user", "content": "And when does the deploy window open?"},
    ]


def chat(
    client: httpx.Client, model: str, slot: int, messages: list[dict[str, Any]]
) -> tuple[dict[str, Any], float]:
    body = {
        "model": model,
        "id_slot": slot,
        "messages": messages,
        "max_tokens": 1,
        "temperature": 0,
        "cache_prompt": True,
    }
    started = time.monotonic()
    response = client.post("/v1/chat/completions", json=body)
    elapsed = time.monotonic() - started
    if response.status_code != 200:
        raise BenchError(f"chat on {model} slot {slot}: {response.status_code} {response.text}")
    timings: dict[str, Any] = response.json()["timings"]
    return timings, elapsed


def prompt_tokens(client: httpx.Client, model: str, messages: list[dict[str, Any]]) -> list[int]:
    rendered = client.post("/apply-template", json={"model": model, "messages": messages})
    text = rendered.json()["prompt"]
    tokens = client.post("/tokenize", json={"model": model, "content": text, "parse_special": True})
    return [int(t) for t in tokens.json()["tokens"]]


def slot_action(
    client: httpx.Client, action: str, model: str, slot: int, filename: str
) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    response = client.post(
        f"/slots/{slot}", params={"action": action}, json={"filename": filename, "model": model}
    )
    elapsed = time.monotonic() - started
    if response.status_code != 200:
        raise BenchError(f"{action} of slot {slot} on {model}: {response.text}")
    result: dict[str, Any] = response.json()
    return result, elapsed


def first_turns(client: httpx.Client, model: str) -> list[Saved]:
    saves = []
    for slot, paragraphs in enumerate(SESSION_PARAGRAPHS):
        session = f"{model}-session-{slot}"
        first = first_messages(session, paragraphs)
        first_tokens = prompt_tokens(client, model, first)
        returning = prompt_tokens(client, model, returning_messages(first))
        chat(client, model, slot, first)
        filename = slot_file_name(session, first_tokens, fingerprint=FINGERPRINT)
        result, _ = slot_action(client, "save", model, slot, filename)
        saves.append(
            Saved(
                preset=model,
                session=session,
                slot=slot,
                filename=filename,
                first_tokens=len(first_tokens),
                ideal_new=len(returning) - common_prefix(first_tokens, returning),
                n_saved=int(result["n_saved"]),
                n_written=int(result["n_written"]),
                save_ms=float(result["timings"]["save_ms"]),
            )
        )
    return saves


def come_back(client: httpx.Client, saved: Saved, event: str, *, durable: bool) -> Return:
    restore_s, n_restored = 0.0, 0
    if durable:
        result, restore_s = slot_action(client, "restore", saved.preset, saved.slot, saved.filename)
        n_restored = int(result["n_restored"])
    first = first_messages(saved.session, SESSION_PARAGRAPHS[saved.slot])
    timings, elapsed = chat(client, saved.preset, saved.slot, returning_messages(first))
    return Return(
        preset=saved.preset,
        event=event,
        session=saved.session,
        durable=durable,
        prompt_n=int(timings["prompt_n"]),
        cache_n=int(timings["cache_n"]),
        ideal_new=saved.ideal_new,
        first_token_s=restore_s + elapsed,
        restore_s=restore_s,
        n_restored=n_restored,
    )


def state_sizes(saves: Sequence[Saved]) -> dict[str, tuple[float, float]]:
    """Per preset, the fixed part and the per-token part of a saved state (two lengths), as
    loopd's save rule fits them (``loopd.engine.saverule.fit_size``)."""
    sizes = {}
    for preset in dict.fromkeys(s.preset for s in saves):
        size = fit_size([(s.n_saved, s.n_written) for s in saves if s.preset == preset])
        if size is not None:
            sizes[preset] = (size.fixed_bytes, size.bytes_per_token)
    return sizes


class Router:
    """The benchmark's router, started again at will."""

    def __init__(self, work: Path, cache_dir: Path) -> None:
        self.work, self.cache_dir = work, cache_dir
        self.saves = work / "slot-saves"
        self.saves.mkdir(parents=True, exist_ok=True)
        self.server = self._start()

    def _start(self) -> devserver.RunningServer:
        return devserver.start(
            self.work / "server",
            self.cache_dir,
            socket_path=self.work / "llama.sock",
            extra_args=("--slot-save-path", str(self.saves)),
            load=PRESETS,
        )

    def restart(self) -> None:
        self.server.kill()
        self.server = self._start()

    def forget(self, event: str, model: str) -> None:
        if event == "restart":
            self.restart()
        else:
            reload_model(self.server, model)


def reload_model(server: devserver.RunningServer, model: str) -> None:
    """The router unloads ``model`` (its child ends, with its slots and host cache) and loads it
    again, as another model's load under ``--models-max`` and a reload would."""
    with fresh_connections(server) as client:
        client.post("/models/unload", json={"model": model})
        deadline = time.monotonic() + 120
        while _status(client, model) != "unloaded":
            if time.monotonic() > deadline:
                raise BenchError(f"{model} did not unload")
            time.sleep(0.1)
        client.post("/models/load", json={"model": model})
        while _status(client, model) != "loaded":
            if time.monotonic() > deadline:
                raise BenchError(f"{model} did not load again")
            time.sleep(0.1)


def fresh_connections(server: devserver.RunningServer) -> httpx.Client:
    """A client opening a new connection for every request: the router can drop a kept-alive
    connection without answering the next request on it (as brokerd's proxy knows)."""
    transport = httpx.HTTPTransport(
        uds=server.url.removeprefix("unix:"), limits=httpx.Limits(max_keepalive_connections=0)
    )
    return httpx.Client(transport=transport, base_url="http://llama", timeout=300)


def _status(client: httpx.Client, model: str) -> str:
    try:
        for entry in client.get("/models").json().get("data", []):
            if entry.get("id") == model:
                return str(entry.get("status", {}).get("value", ""))
    except httpx.TransportError:
        pass  # the router may drop a connection while it swaps a model
    return ""


def run(work: Path, cache_dir: Path) -> Durable:
    log.info("durable sessions: a router of its own with --slot-save-path")
    router = Router(work, cache_dir)
    try:
        saves: list[Saved] = []
        returns: list[Return] = []
        for model in PRESETS:
            with fresh_connections(router.server) as client:
                saves += first_turns(client, model)
        for event in EVENTS:
            for model in PRESETS:
                mine = [s for s in saves if s.preset == model]
                for durable in (False, True):
                    log.info("durable: %s of %s, durable sessions %s", event, model, durable)
                    router.forget(event, model)
                    with fresh_connections(router.server) as client:
                        returns += [come_back(client, s, event, durable=durable) for s in mine]
        return Durable(saves, returns, state_sizes(saves))
    finally:
        router.server.stop()


def render(result: Durable) -> str:
    lines = [
        "## Durable sessions: returning after the server forgot",
        "",
        "The server's own save and restore (`--slot-save-path`, `POST /slots/{id}?action=save` "
        "and `restore`), driven by raw HTTP calls: what the server can do (loopd's own rule "
        "follows, below). Each session's first prompt is read once and its slot saved; then the "
        "server is killed and started again (*restart*) or the router unloads and reloads the "
        "model (*reload*), and each session returns with its next message, without and with "
        "a restore of its file first (the server forgot again in between). `max_tokens` 1.",
        "",
        "| Preset | Event | Session (first prompt) | Restored | cache_n | prompt_n "
        "| ideal (new tokens) | prompt_n/ideal | Time to first token | of which restore |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    first = {s.session: s.first_tokens for s in result.saves}
    for r in result.returns:
        lines.append(
            f"| {r.preset} | {r.event} | {first[r.session]} tokens | "
            f"{'yes' if r.durable else 'no'} | {r.cache_n} | {r.prompt_n} | {r.ideal_new} "
            f"| {r.over_ideal:.2f} | {r.first_token_s * 1000:.0f} ms "
            f"| {r.restore_s * 1000:.1f} ms |"
        )
    lines += [
        "",
        "Saved states (the server's own figures):",
        "",
        "| Preset | Tokens held | Bytes | Bytes per token | save_ms |",
        "|---|---|---|---|---|",
    ]
    for s in result.saves:
        lines.append(
            f"| {s.preset} | {s.n_saved} | {s.n_written:,} | {s.n_written / s.n_saved:,.0f} "
            f"| {s.save_ms:.1f} |"
        )
    lines += ["", "| Preset | Fixed part (recurrent state) | Per token (KV) |", "|---|---|---|"]
    for preset, (fixed, per_token) in result.state_sizes.items():
        lines.append(f"| {preset} | {fixed:,.0f} bytes | {per_token:,.0f} bytes |")
    return "\n".join(lines) + "\n"
