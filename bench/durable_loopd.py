"""Durable sessions through loopd itself: sessions that return after the server was killed and
started again (*restart*), or after the router unloaded the model and loaded it again
(*reload*), with ``durable`` off and on (``loopd.engine.durable``: loopd saves each answered
turn's slot and restores it when the first progress event shows the server lost the session).

On each preset a router of its own (``--slot-save-path``), two sessions pinned to slots 0 and
1, one turn each; the router is killed (SIGKILL to it and its children) and started again, or
unloads and reloads the model; each session's next turn is measured by its answered request's
own perf record: ``cache_n``, ``prompt_n``, and the ideal, the new tokens (what the request
held past what loopd expected the server to keep, ``expected_reuse``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.durable import EVENTS, reload_model
from loopd.config import SHORTHAND_ENDPOINT, Settings, load_settings
from loopd.engine.durable import DurableMode
from loopd.engine.pinning import PinSlots
from loopd.selftest.expected import ServerAnswers
from loopd.sessionlog.records import Request, RequestKind, fresh_external_key
from loopd.sessions import Runtime
from loopd_dev import devserver

log = logging.getLogger("bench.durable")

PRESETS = (devserver.PLAIN_MODEL, devserver.HYBRID_MODEL)
SESSIONS = ("alpha", "beta")
NOTE = (
    "Thread {session}, note {n}: the parser tests run nightly, the audit table moves on "
    "Tuesday, and the deploy window opens on Thursday after every owner signs off."
)
NOTES = 20
SECOND = "Which day does the deploy window open?"


@dataclass(frozen=True)
class LoopdReturn:
    preset: str
    event: str
    durable: bool
    session: str
    cache_n: int
    prompt_n: int
    ideal_new: int
    cause: str
    requests: int  # the turn's requests to the server (a lost one, closed, and its resend)

    @property
    def over_ideal(self) -> float:
        return self.prompt_n / max(self.ideal_new, 1)


def first_message(session: str, notes_count: int = NOTES) -> str:
    notes = " ".join(NOTE.format(session=session, n=n) for n in range(notes_count))
    return f"Keep these notes for later, and say only 'noted'. {notes}"


def settings_for(
    url: str, model: str, state: Path, durable: bool, pin_slots: PinSlots = PinSlots.YES
) -> Settings:
    return load_settings(
        infer_url=url,
        model=model,
        state_dir=state,
        slots=(0, 1),
        max_tokens=24,
        think_cap=0,  # the random hybrid model never ends its thinking on its own
        temperature=0.0,
        pin_slots=pin_slots,
        durable=DurableMode.ON if durable else DurableMode.OFF,
    )


async def say(runtime: Runtime, session_id: str, text: str) -> list[Request]:
    session = runtime.ensure_session(session_id)
    before = len(runtime.log.requests(session_id))
    await runtime.append_user(session_id, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    if outcome.failure is not None:
        raise RuntimeError(f"turn of {session_id} failed: {outcome.failure}")
    return runtime.log.requests(session_id)[before:]


def answered(requests: list[Request]) -> Request:
    return next(
        r
        for r in requests
        if r.record.kind is RequestKind.TURN and r.record.perf.outcome == "complete"
    )


def measured(
    preset: str, event: str, durable: bool, session: str, requests: list[Request]
) -> LoopdReturn:
    perf = answered(requests).record.perf
    cache_n, prompt_n = perf.cache_n or 0, perf.prompt_n or 0
    expected = int(perf.extra.get("expected_reuse", 0))
    return LoopdReturn(
        preset=preset,
        event=event,
        durable=durable,
        session=session,
        cache_n=cache_n,
        prompt_n=prompt_n,
        ideal_new=cache_n + prompt_n - expected,
        cause=perf.cache_loss_cause or "",
        requests=sum(1 for r in requests if r.record.kind is RequestKind.TURN),
    )


def start(
    work: Path, cache_dir: Path, model: str, presets: tuple[devserver.Preset, ...] = ()
) -> devserver.RunningServer:
    """A router of its own saving slots into ``work/saves``, serving ``model`` (one of its own
    presets, or one of ``presets``)."""
    return devserver.start(
        work / "server",
        cache_dir,
        socket_path=work / "llama.sock",
        extra_args=("--slot-save-path", str(work / "saves")),
        presets=presets,
        load=(model,),
    )


def one_run(
    work: Path, cache_dir: Path, model: str, event: str, durable: bool
) -> list[LoopdReturn]:
    (work / "saves").mkdir(parents=True, exist_ok=True)
    servers = [start(work, cache_dir, model)]

    async def sessions() -> list[LoopdReturn]:
        # What ``loopd serve``'s self-test finds: the slots keep their prompts (pinned), and
        # save and restore round-trip here.
        found = ServerAnswers(idle_slots_cleared=False, durable_available=durable)
        settings = settings_for(servers[0].url, model, work / "state", durable)
        runtime = Runtime.open(settings, selftest={SHORTHAND_ENDPOINT: found})
        try:
            for session in SESSIONS:
                await say(runtime, session, first_message(session))
            if event == "restart":
                servers[0].kill()
                servers[0] = start(work, cache_dir, model)
            else:
                await anyio.to_thread.run_sync(reload_model, servers[0], model)
            return [
                measured(model, event, durable, session, await say(runtime, session, SECOND))
                for session in SESSIONS
            ]
        finally:
            await runtime.aclose()

    try:
        return anyio.run(sessions)
    finally:
        servers[0].stop()


def run(work: Path, cache_dir: Path) -> list[LoopdReturn]:
    returns = []
    for event in EVENTS:
        for model in PRESETS:
            for durable in (False, True):
                log.info(
                    "durable through loopd: %s of %s, durable %s",
                    event,
                    model,
                    "on" if durable else "off",
                )
                work_dir = work / f"{event}-{model}-{durable}"
                returns += one_run(work_dir, cache_dir, model, event, durable)
    return returns


def render(returns: list[LoopdReturn]) -> str:
    lines = [
        "### Through loopd (`durable` off and on): returning after a restart or a reload",
        "",
        "Two sessions per preset, pinned to slots 0 and 1, one turn each; the router killed "
        "and started again (*restart*), or the model unloaded and loaded again (*reload*); "
        "each session's next turn, measured by its answered request's perf "
        "record. With `durable` on, loopd saved each answered turn's slot (the rule's figures "
        "are not measured after one turn, so it saves); before its next turn it read the "
        "model, found its process new (it restarted), restored the save and sent the request "
        "once (*requests* counts the turn's requests to the server).",
        "",
        "| Preset | Event | durable | Session | cache_n | prompt_n | ideal (new tokens) "
        "| loopd/ideal | Recorded cause | Requests |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in returns:
        lines.append(
            f"| {r.preset} | {r.event} | {'on' if r.durable else 'off'} | {r.session} "
            f"| {r.cache_n} "
            f"| {r.prompt_n} | {r.ideal_new} | {r.over_ideal:.2f} | {r.cause or '-'} "
            f"| {r.requests} |"
        )
    return "\n".join(lines) + "\n"
