"""The self-test's I/O shell: ask the server, fill in ``ServerFacts``. Judging is in ``checks.py``.

Every request uses loopd's own client and request builder, so what is probed is what loopd sends.
Live requests go only to a harness slot (the first of ``LOOPD_SLOTS``), except the cache probe's
where loopd will not pin (the pool probe's answer: they then go as the engine's will, placed by
the server), and are logged with kind ``selftest``. They are short on purpose and carry no
tools: the cache and stream probes test the server's mechanics, and a tools array would make
them slow on a CPU. The tools array is exercised by the render probe, which costs no generation.

The router sometimes closes a kept-alive connection after proxying a response without saying so,
and the next request on that pooled connection fails with "Server disconnected without sending a
response" (measured on build 11434: 5 of 15 requests sent right after a stream, 1 of 30
back-to-back ``/apply-template`` calls). Nothing reached the server then, so the probe's
idempotent calls are retried on exactly that; each streamed request gets a client (so a
connection) of its own, because a stream is not retried.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import anyio
from tenacity import retry_if_exception

from loopcommon.retry import AT_ONCE, retrying
from loopd.config import Settings
from loopd.engine.client import EventStream, InferenceClient
from loopd.engine.durable import probe_name
from loopd.engine.limits import Limits
from loopd.engine.outcome import Failure, RequestResult
from loopd.engine.pinning import PinSlots, decide_pinning
from loopd.engine.quiet import Call, Purpose, may_send
from loopd.engine.request import RequestSettings, Sampling, build_body
from loopd.engine.stream import run_request
from loopd.engine.thinkcap import SUCCESS
from loopd.errors import ConnectionDropped, InferenceError, ServerRejected, ServerUnreachable
from loopd.selftest import template
from loopd.selftest.facts import (
    CacheProbe,
    DurableProbe,
    Health,
    Listing,
    MalformedAnswer,
    PoolProbe,
    Props,
    RenderProbe,
    RouterFacts,
    ServerFacts,
    SlotInfo,
    StreamProbe,
    StreamTally,
    TemplateProbe,
    model_status,
    parse_listing,
    parse_props,
    parse_router_props,
    parse_slots,
)
from loopd.selftest.template import TemplateAnswer
from loopd.sessionlog.records import RequestKind

log = logging.getLogger("loopd.selftest")

APPLY_TEMPLATE_PATH = "/apply-template"
PROBE_SYSTEM_TEXT = "You are a self-test."
COUNTING = "Count from 1 to 100, one number per line."
# The failures a probe records as a fact instead of raising: the server answered badly or not.
_PROBE_ERRORS = (InferenceError, ValueError)

ClientFactory = Callable[[], InferenceClient]
T = TypeVar("T")


def _dropped(exc: BaseException) -> bool:
    """A pooled connection closed before the server answered: the request never reached it."""
    return isinstance(exc, ConnectionDropped)


async def _idempotent(call: Callable[[], Awaitable[T]]) -> T:
    """Run a call that changes nothing on the server, again if its connection was dropped."""
    async for attempt in retrying(AT_ONCE, retry_if_exception(_dropped), attempts=3):
        with attempt:
            return await call()
    raise AssertionError("AsyncRetrying with reraise=True either returns or raises")


@dataclass(frozen=True)
class ProbeConfig:
    """What the probes need to know about loopd's own settings."""

    harness_slots: tuple[int, ...]
    sampling: Sampling
    max_tokens: int  # loopd's, for the render probe: exactly the settings loopd sends
    system_text: str
    tools_text: str  # the epoch's tools array text, "" for none
    first_byte_s: float  # also the wait for a model the router loads on demand
    silence_s: float
    small_call_s: float
    cache_probe_tokens: int = 4
    stream_probe_tokens: int = 32
    pin_slots: PinSlots = PinSlots.AUTO  # the cache probe sends its requests as the engine will

    @classmethod
    def from_settings(cls, settings: Settings, tools_text: str) -> ProbeConfig:
        return cls(
            harness_slots=settings.slots,
            sampling=settings.sampling,
            max_tokens=settings.max_tokens,
            system_text=settings.system_text,
            tools_text=tools_text,
            first_byte_s=settings.first_byte_s,
            silence_s=settings.silence_s,
            small_call_s=settings.connect_s,
            pin_slots=settings.pin_slots,
        )

    def request(self, model: str, max_tokens: int | None = None) -> RequestSettings:
        return RequestSettings(
            model=model,
            slot=self.harness_slots[0],
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            sampling=self.sampling,
        )


async def gather_facts(
    connect: ClientFactory,
    config: ProbeConfig,
    *,
    live: bool = True,
    purpose: Purpose = Purpose.PERSON,
) -> ServerFacts:
    """Ask the server everything the checks need; never raises for what the server does.

    ``connect`` opens a new client for the configured URL and model (see the module's note).
    Without ``live``, only what costs no generation and no render: health, the listing, the
    model's state, ``/props``, and ``/slots`` where a person waits (``loopd serve`` checks that
    much every few minutes, as a background check). ``purpose`` decides what may be sent
    (``loopd.engine.quiet``): where nobody waits, nothing loads the model, a check sends
    nothing that wakes it, and the live probes run only on a model awake now
    (``ServerFacts.live_skipped`` says why they did not).
    """
    async with connect() as client:
        facts = ServerFacts(
            url=client.url,
            model=client.model,
            harness_slots=config.harness_slots,
            health=await probe_health(client, config.small_call_s),
        )
        if not facts.health.healthy:
            why = "the server is unreachable" if not facts.health.reachable else "not healthy"
            facts.missing.update(dict.fromkeys(_ALL_FACTS, f"not checked: {why}"))
            return facts
        try:
            facts.listing = await probe_listing(client, config.small_call_s)
        except _PROBE_ERRORS as exc:
            facts.missing.update(dict.fromkeys(_ALL_FACTS, f"GET /models failed: {exc}"))
            return facts
        if facts.listing.router and client.model not in facts.listing.served:
            # Every further call names the model; the router would refuse each one.
            facts.missing.update(dict.fromkeys(_ALL_FACTS, f"{client.model} is not served"))
            return facts
        if facts.listing.router:
            facts.router = await probe_router(client, config.small_call_s)
        await _gather_layout(client, config, facts, purpose)
    if not live:
        return facts
    verdict = may_send(Call.CHAT, purpose, facts.model_status)
    if not verdict.allowed:
        facts.live_skipped = verdict.why
        facts.missing.update(dict.fromkeys(_LIVE_FACTS, f"not run: {verdict.why}"))
        return facts
    await _gather_live(connect, config, facts)
    async with connect() as client:
        facts.render = await probe_render(client, config)
        facts.template = await probe_template(client, config)
    return facts


_LIVE_FACTS = ("cache", "pool", "durable", "stream", "render", "template")
_ALL_FACTS = ("listing", "props", "slots", *_LIVE_FACTS)


async def _gather_layout(
    client: InferenceClient, config: ProbeConfig, facts: ServerFacts, purpose: Purpose
) -> None:
    try:
        # A router loads the model for /props if it is not running (where a person waits):
        # allow for the load.
        facts.props = await probe_props(client, config.first_byte_s, purpose)
    except _PROBE_ERRORS as exc:
        facts.missing["props"] = f"GET /props failed: {exc}"
        facts.props_loading = isinstance(exc, ServerRejected) and exc.status == 503
    # After /props, which loaded the model where a person waits: its file's figures are listed
    # only while it runs.
    facts.reading = await client.model_reading(config.small_call_s)
    verdict = may_send(Call.SLOTS, purpose, facts.model_status)
    if not verdict.allowed:
        facts.missing["slots"] = f"not asked: {verdict.why}"
        return
    try:
        facts.slots = await probe_slots(client, config.small_call_s)
    except _PROBE_ERRORS as exc:
        facts.missing["slots"] = f"GET /slots failed: {exc}"


async def _gather_live(connect: ClientFactory, config: ProbeConfig, facts: ServerFacts) -> None:
    slot = config.harness_slots[0]
    if facts.slots is None or slot not in {s.id for s in facts.slots}:
        why = facts.why_missing("slots") if facts.slots is None else f"slot {slot} does not exist"
        facts.missing["cache"] = facts.missing["stream"] = f"not run: {why}"
        facts.missing["pool"] = facts.missing["durable"] = f"not run: {why}"
        return
    facts.pool = await probe_pool(connect, config, other_slot(config, facts.slots))
    # The cache probe sends as the engine will, which the pool probe's answer decides.
    cleared = facts.pool.cleared if not facts.pool.failure else None
    pinning = decide_pinning(config.pin_slots, selftest=cleared, recorded=None)
    facts.cache = await probe_cache(connect, config, pinning.id_slot(slot))
    facts.durable = await probe_durable(connect, slot)
    facts.stream = await probe_stream(connect, config)


async def probe_health(client: InferenceClient, limit_s: float) -> Health:
    try:
        healthy = await _idempotent(lambda: client.health(limit_s))
    except ServerUnreachable as exc:
        return Health(reachable=False, healthy=False, detail=str(exc))
    return Health(True, healthy, "" if healthy else "/health did not answer 200 (loading?)")


async def probe_listing(client: InferenceClient, limit_s: float) -> Listing:
    data = await _idempotent(lambda: client.models(limit_s))
    listing = parse_listing(data)
    return Listing(listing.router, listing.served, model_status(data, client.model))


async def probe_props(
    client: InferenceClient, limit_s: float, purpose: Purpose = Purpose.PERSON
) -> Props:
    return parse_props(await _idempotent(lambda: client.props(limit_s, purpose=purpose)))


async def probe_router(client: InferenceClient, limit_s: float) -> RouterFacts | None:
    """The router's own ``/props``; None where it cannot be read (no check depends on it)."""
    try:
        return parse_router_props(await _idempotent(lambda: client.router_props(limit_s)))
    except _PROBE_ERRORS as exc:
        log.info("the router's /props could not be read: %s", exc)
        return None


async def probe_slots(client: InferenceClient, limit_s: float) -> tuple[SlotInfo, ...]:
    return parse_slots(await _idempotent(lambda: client.slots(limit_s)))


async def probe_cache(
    connect: ClientFactory, config: ProbeConfig, slot: int | None = None
) -> CacheProbe:
    """The same short request twice on a harness slot (or, for ``ANY_SLOT``, where the server
    places it); the second should find it cached."""
    slot = config.harness_slots[0] if slot is None else slot
    limits = Limits(
        first_byte_s=config.first_byte_s,
        silence_s=config.silence_s,
        think_cap=config.cache_probe_tokens + 1,  # never reached: the probe has no cap to test
    )
    first = await _cache_request(connect, config, limits, "cache probe 1", slot=slot)
    if first.assembler.timings is None or not first.complete:
        return CacheProbe(
            slot, failure=f"first request: {_failure(first)}", interrupted=on_the_way(first)
        )
    second = await _cache_request(connect, config, limits, "cache probe 2", slot=slot)
    t1, t2 = first.assembler.timings, second.assembler.timings
    if t2 is None or not second.complete:
        return CacheProbe(
            slot,
            t1.cache_n + t1.prompt_n,
            failure=f"second: {_failure(second)}",
            interrupted=on_the_way(second),
        )
    return CacheProbe(slot, t1.cache_n + t1.prompt_n, t2.cache_n, t2.prompt_n)


async def probe_durable(connect: ClientFactory, slot: int) -> DurableProbe:
    """Save the slot (it holds the cache probe's prompt) under loopd's probe name and restore
    it: the round trip durable sessions rest on."""
    async with connect() as client:
        name = probe_name(client.model)
        try:
            saved = await client.save_slot(slot, name)
            restored = await client.restore_slot(slot, name)
        except InferenceError as exc:
            return DurableProbe(slot, failure=str(exc))
    if restored.n_tokens != saved.n_tokens:
        return DurableProbe(
            slot,
            saved.n_tokens,
            restored.n_tokens,
            failure=f"saved {saved.n_tokens} tokens, restored {restored.n_tokens}",
        )
    return DurableProbe(slot, saved.n_tokens, restored.n_tokens)


async def _cache_request(
    connect: ClientFactory,
    config: ProbeConfig,
    limits: Limits,
    what: str,
    *,
    slot: int | None = None,
    user_text: str = "Say OK.",
) -> RequestResult:
    slot = config.harness_slots[0] if slot is None else slot
    async with connect() as client:
        settings = replace(config.request(client.model, config.cache_probe_tokens), slot=slot)
        body = build_body(settings, "", template.first_turn(PROBE_SYSTEM_TEXT, user_text))
        result = await run_request(client, body, slot=slot, limits=limits)
    _log_probe(what, slot, result)
    return result


def other_slot(config: ProbeConfig, slots: tuple[SlotInfo, ...]) -> int | None:
    """The slot the pool probe runs its second request on: another harness slot if loopd has
    one, else the lowest other slot of the server; None when the server has only one."""
    first = config.harness_slots[0]
    candidates = [s for s in config.harness_slots[1:] if s != first]
    candidates += sorted(s.id for s in slots if s.id != first)
    return candidates[0] if candidates else None


async def probe_pool(connect: ClientFactory, config: ProbeConfig, other: int | None) -> PoolProbe:
    """A prompt on the harness slot, another on a second slot, the first again: does the harness
    slot keep its prompt while another slot runs? (See ``PoolProbe``.) A request on the other
    slot waits, like any pinned request, while another client's request runs there."""
    slot = config.harness_slots[0]
    if other is None:
        return PoolProbe(slot)
    limits = Limits(
        first_byte_s=config.first_byte_s,
        silence_s=config.silence_s,
        think_cap=config.cache_probe_tokens + 1,
    )
    ask = "Pool probe: say OK."
    first = await _cache_request(connect, config, limits, "pool probe 1", user_text=ask)
    if first.assembler.timings is None or not first.complete:
        return PoolProbe(
            slot, other, failure=f"first request: {_failure(first)}", interrupted=on_the_way(first)
        )
    between = await _cache_request(
        connect, config, limits, "pool probe 2", slot=other, user_text="Pool probe: say no."
    )
    if not between.complete:
        return PoolProbe(
            slot,
            other,
            failure=f"request on slot {other}: {_failure(between)}",
            interrupted=on_the_way(between),
        )
    again = await _cache_request(connect, config, limits, "pool probe 3", user_text=ask)
    t1, t3 = first.assembler.timings, again.assembler.timings
    if t3 is None or not again.complete:
        return PoolProbe(
            slot,
            other,
            t1.cache_n + t1.prompt_n,
            failure=f"third: {_failure(again)}",
            interrupted=on_the_way(again),
        )
    return PoolProbe(slot, other, t1.cache_n + t1.prompt_n, t3.cache_n)


# How much longer each new attempt of the stream probe lets the answer run, and how many there
# are: a server that writes the probe's answer before the control call arrives (the tiny hybrid
# model writes 32 tokens in about 15 ms) is asked again for a longer one.
STREAM_PROBE_GROWTH = 16
STREAM_PROBE_ATTEMPTS = 3


async def probe_stream(connect: ClientFactory, config: ProbeConfig) -> StreamProbe:
    """A streamed request with loopd's settings; the control call goes out at the first token.

    Read with the engine's own reader (``EventStream``) and control call (``end_reasoning``),
    chunk by chunk rather than through ``run_request``: the probe must see every timings event,
    and send the control call whether or not the model thinks (a template without thinking tags
    still arms the completion, and the server answers ``success``), where the engine sends it
    only at its thinking cap. When the answer was complete before the control call reached the
    server, the probe runs again with a longer answer (``STREAM_PROBE_GROWTH``), each time on a
    client of its own.
    """
    tokens = config.stream_probe_tokens
    for _ in range(STREAM_PROBE_ATTEMPTS):
        async with connect() as client:
            probe = await _stream_once(client, config, tokens)
        if probe.control_answer == SUCCESS or probe.failure or not probe.complete:
            return probe
        tokens *= STREAM_PROBE_GROWTH
    return probe


async def _stream_once(client: InferenceClient, config: ProbeConfig, tokens: int) -> StreamProbe:
    slot = config.harness_slots[0]
    settings = config.request(client.model, tokens)
    # A long answer, cut by max_tokens: the completion must still run when the control call
    # arrives, even on a fast server and with a model that does not think.
    body = build_body(settings, "", template.first_turn(PROBE_SYSTEM_TEXT, COUNTING))
    tally = StreamTally()
    control: str | None = None
    failure = ""
    interrupted = False
    try:
        with anyio.fail_after(config.first_byte_s + config.silence_s):
            async with client.stream_chat(body) as response:
                events = EventStream(response)
                while not events.at_end:
                    for event in await events.receive():
                        tally.apply(event)
                    if control is None and tally.generating:
                        control = await client.end_reasoning(tally.assembler.completion_id)
                    if tally.assembler.done or tally.assembler.server_error is not None:
                        break
    except TimeoutError:
        failure = f"no complete stream within {config.first_byte_s + config.silence_s:g} s"
        interrupted = True
    except InferenceError as exc:
        failure = str(exc)
        interrupted = not isinstance(exc, ServerRejected) or exc.status >= 500
    probe = tally.result(slot, control, failure)
    if interrupted or tally.assembler.server_error is not None:
        probe = replace(probe, interrupted=True)
    log.info(
        "selftest request",
        extra={
            "fields": {
                "kind": RequestKind.SELFTEST.value,
                "probe": "stream",
                "slot": slot,
                "max_tokens": tokens,
            }
        },
    )
    return probe


async def probe_render(client: InferenceClient, config: ProbeConfig) -> RenderProbe:
    """Render loopd's exact bodies (tools, settings, a tool round); a 500 here would be a 500
    for every request."""
    settings = config.request(client.model)
    conversations = {
        "first turn": template.first_turn(config.system_text),
        "tool round": template.tool_turn(config.system_text, _first_tool(config.tools_text)),
    }
    for label, messages in conversations.items():
        body = json.loads(build_body(settings, config.tools_text, messages))
        try:
            await _render(client, body, config.first_byte_s)
        except _PROBE_ERRORS as exc:
            return RenderProbe(rendered=0, failure=f"{label}: {exc}")
    return RenderProbe(rendered=len(conversations))


async def probe_template(client: InferenceClient, config: ProbeConfig) -> TemplateProbe:
    """Does the template keep past reasoning, and does a user message after a tool round only
    extend the prompt? Rendered with loopd's settings, without the generation prompt."""
    settings = config.request(client.model)
    tool = _first_tool(config.tools_text)
    system = config.system_text

    async def render(messages: list[str]) -> tuple[str | None, str]:
        body: dict[str, Any] = json.loads(build_body(settings, config.tools_text, messages))
        body["add_generation_prompt"] = False
        try:
            return await _render(client, body, config.first_byte_s), ""
        except _PROBE_ERRORS as exc:
            return None, str(exc)

    answered, error_a = await render(template.answered_then_user(system))
    before, error_b = await render(template.tool_turn(system, tool))
    after, error_c = await render(template.user_after_tool(system, tool))
    prefix = template.judge_prefix_extension(before, after)
    detail = error_a or error_b or error_c
    if prefix is TemplateAnswer.NO and before is not None and after is not None:
        detail = template.divergence(before, after)
    return TemplateProbe(template.judge_keeps_reasoning(answered), prefix, detail)


async def template_keeps_reasoning(
    client: InferenceClient, config: ProbeConfig | None = None
) -> TemplateAnswer:
    """Whether the served template renders an earlier turn's reasoning (yes, no, unknown).

    For the perf records: with a template that drops it, the cache loss after an answer that
    thought is the template's doing (``LossCause.TEMPLATE_DROPS_REASONING``).
    """
    config = config or ProbeConfig(
        harness_slots=(0,),
        sampling=Sampling(),
        max_tokens=16,
        system_text=PROBE_SYSTEM_TEXT,
        tools_text="",
        first_byte_s=60.0,
        silence_s=60.0,
        small_call_s=client.connect_s,
    )
    return (await probe_template(client, config)).keeps_past_reasoning


async def _render(client: InferenceClient, body: dict[str, Any], limit_s: float) -> str:
    answer = await _idempotent(lambda: client.post_json(APPLY_TEMPLATE_PATH, body, limit_s))
    prompt = answer.get("prompt") if isinstance(answer, dict) else None
    if not isinstance(prompt, str):
        raise MalformedAnswer(f"{APPLY_TEMPLATE_PATH} answered without a prompt")
    return prompt


def _first_tool(tools_text: str) -> str:
    """A declared tool's name for the probe's tool call (a template may check it is declared)."""
    try:
        tools = json.loads(tools_text) if tools_text else []
        name = tools[0]["function"]["name"]
    except (ValueError, LookupError, TypeError):
        return "read_file"
    return name if isinstance(name, str) else "read_file"


# Failures on the way: the request never got the server's answer to what it asked.
_ON_THE_WAY = frozenset(
    {
        Failure.UNREACHABLE,
        Failure.SERVER_GONE,
        Failure.FIRST_BYTE_TIMEOUT,
        Failure.SILENCE,
        Failure.SERVER_ERROR,
        Failure.TRUNCATED,
        Failure.POOL_FULL,
    }
)


def on_the_way(result: RequestResult) -> bool:
    """The probe request failed before the server could answer it (down, restarting its
    model, 5xx, a broken stream), not with an answer that differs from the recorded one."""
    if result.failure is Failure.REJECTED:
        return (result.status_code or 0) >= 500
    return result.failure in _ON_THE_WAY


def _failure(result: RequestResult) -> str:
    if result.failure is not None:
        return result.detail or result.failure.value
    return "no timings in the stream"


def _log_probe(what: str, slot: int, result: RequestResult) -> None:
    t = result.assembler.timings
    fields: dict[str, Any] = {"kind": RequestKind.SELFTEST.value, "probe": what, "slot": slot}
    if t is not None:
        fields.update(cache_n=t.cache_n, prompt_n=t.prompt_n, predicted_n=t.predicted_n)
    if result.failure is not None:
        fields["failure"] = result.failure.value
    log.info("selftest request", extra={"fields": fields})
