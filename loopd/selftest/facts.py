"""What the self-test found out about the server, as plain data. Pure.

``probe.py`` gathers these (the I/O); ``checks.py`` judges them against the expectations. A fact
left as None was not gathered: ``ServerFacts.missing`` says why, and the check that needed it
fails with that reason instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loopd.engine.modelstate import ModelReading, ModelStatus
from loopd.selftest.template import TemplateAnswer
from loopd.wire.assemble import StreamAssembler
from loopd.wire.events import Progress, StreamEvent, Timings


class MalformedAnswer(ValueError):
    """A server answer that does not have the shape llama-server's API gives it."""


@dataclass(frozen=True)
class Health:
    reachable: bool
    healthy: bool
    detail: str = ""


@dataclass(frozen=True)
class Listing:
    """``GET /models``: in router mode every id and alias, and the status of loopd's model."""

    router: bool
    served: tuple[str, ...]
    status: str = ""


@dataclass(frozen=True)
class Props:
    """``GET /props?model=``: the fields the self-test compares."""

    build_info: str
    model_alias: str
    chat_template: str
    tool_use_template: str | None
    caps: dict[str, bool]
    n_ctx_per_slot: int
    total_slots: int


@dataclass(frozen=True)
class RouterFacts:
    """``GET /props`` of a router (no model named): how many models it holds at once
    (``--models-max``; 0: no limit), and whether a request loads a model on demand."""

    max_instances: int | None
    models_autoload: bool | None


def parse_router_props(data: dict[str, Any]) -> RouterFacts | None:
    """The router's own ``/props`` (``role`` router); None for anything else."""
    if data.get("role") != "router":
        return None
    most, autoload = data.get("max_instances"), data.get("models_autoload")
    return RouterFacts(
        most if isinstance(most, int) and not isinstance(most, bool) else None,
        autoload if isinstance(autoload, bool) else None,
    )


@dataclass(frozen=True)
class SlotInfo:
    id: int
    n_ctx: int
    is_processing: bool


@dataclass(frozen=True)
class CacheProbe:
    """Two identical requests on one harness slot: the second should reuse the first's prompt."""

    slot: int
    first_prompt_tokens: int | None = None  # cache_n + prompt_n of the first request
    second_cache_n: int | None = None
    second_prompt_n: int | None = None
    failure: str = ""
    interrupted: bool = False  # the failure was on the way (see ``ServerFacts.interrupted``)


@dataclass(frozen=True)
class PoolProbe:
    """A prompt on the harness slot, another prompt on a second slot, then the first again on
    the harness slot: is a slot's prompt still there once another slot has run?

    On a unified KV pool with ``--cache-idle-slots`` (the server's default there) every task
    launch saves the idle slots to the host cache and clears them, and a request pinned to a
    cleared slot is not restored (docs/production-shape.md): the third request reads
    everything again.
    """

    slot: int
    other_slot: int | None = None  # None: the server has no other slot
    first_prompt_tokens: int | None = None
    again_cache_n: int | None = None
    failure: str = ""
    interrupted: bool = False

    @property
    def cleared(self) -> bool | None:
        """True: the slot lost its prompt; False: kept (or nothing else can run); None: the
        probe did not complete."""
        if self.other_slot is None and not self.failure:
            return False
        if self.failure or self.first_prompt_tokens is None or self.again_cache_n is None:
            return None
        return self.again_cache_n * 2 < self.first_prompt_tokens


@dataclass(frozen=True)
class DurableProbe:
    """The probe's slot saved to the server's disk under loopd's own probe name and restored
    (``loopd.engine.durable``): durable sessions are available when both answer success for the
    same number of tokens."""

    slot: int
    n_saved: int | None = None
    n_restored: int | None = None
    failure: str = ""  # the server's refusal (501 without ``--slot-save-path``), or a mismatch

    @property
    def available(self) -> bool:
        return not self.failure and self.n_saved is not None and self.n_saved > 0


@dataclass(frozen=True)
class StreamProbe:
    """One streamed request with loopd's settings, and the control call sent while it ran."""

    slot: int
    progress_events: int = 0
    timings_events: int = 0
    token_counts: int = 0  # distinct predicted_n values: more than one means per-token timings
    control_answer: str | None = None  # "success", the server's refusal, or None if never sent
    complete: bool = False
    failure: str = ""
    interrupted: bool = False


@dataclass(frozen=True)
class RenderProbe:
    """loopd's exact request bodies rendered through ``/apply-template``."""

    rendered: int = 0
    failure: str = ""


@dataclass(frozen=True)
class TemplateProbe:
    keeps_past_reasoning: TemplateAnswer = TemplateAnswer.UNKNOWN
    tool_turn_prefix: TemplateAnswer = TemplateAnswer.UNKNOWN
    detail: str = ""


@dataclass
class ServerFacts:
    """Everything gathered in one self-test run; filled in step by step by ``probe.py``."""

    url: str
    model: str
    harness_slots: tuple[int, ...]
    health: Health
    listing: Listing | None = None
    reading: ModelReading | None = None  # the model's state and weights, read without waking it
    router: RouterFacts | None = None
    props: Props | None = None
    slots: tuple[SlotInfo, ...] | None = None
    cache: CacheProbe | None = None
    pool: PoolProbe | None = None
    stream: StreamProbe | None = None
    render: RenderProbe | None = None
    template: TemplateProbe | None = None
    durable: DurableProbe | None = None
    missing: dict[str, str] = field(default_factory=dict)  # fact name -> why it is None
    # Why the live probes did not run although asked for: they would wake or load the model
    # and nobody waits (``loopd.engine.quiet``). None: they ran, or were not asked for.
    live_skipped: str | None = None

    def why_missing(self, name: str) -> str:
        return self.missing.get(name, "not gathered")

    @property
    def model_status(self) -> ModelStatus:
        return self.reading.status if self.reading is not None else ModelStatus.UNKNOWN

    # ``/props`` answered 503 (the server loading the model): its facts wait for the load.
    props_loading: bool = False

    @property
    def model_away(self) -> str | None:
        """Why the model's own facts could not be read: it is not loaded (and nobody waits to
        load it), or it is loading. None when they were read, or failed otherwise."""
        if self.props is not None:
            return None
        if self.props_loading:
            return "the model is loading: checked once it is loaded"
        if self.model_status in {ModelStatus.UNLOADED, ModelStatus.LOADING}:
            return f"the model is {self.model_status.value}: checked once it is loaded"
        return None

    @property
    def interrupted(self) -> str | None:
        """Why a live probe's request failed on the way (the server unreachable mid-run,
        restarting its model, answering 5xx, breaking the stream), or None. Such a run says
        nothing about how the server behaves: ``loopd serve`` checks again soon instead of
        calling the server changed."""
        for probe in (self.pool, self.cache, self.stream):
            if probe is not None and probe.interrupted:
                return probe.failure
        return None


def parse_listing(data: dict[str, Any]) -> Listing:
    """Router mode lists models with a ``status``; a single-model server lists itself without."""
    entries = [e for e in data.get("data", []) if isinstance(e, dict)]
    router = any("status" in e for e in entries)
    served: list[str] = []
    for entry in entries:
        served.append(str(entry.get("id", "")))
        served.extend(str(a) for a in entry.get("aliases") or [] if isinstance(a, str))
    return Listing(router=router, served=tuple(s for s in served if s))


def model_status(data: dict[str, Any], model: str) -> str:
    """The router's status value for ``model`` (``loaded``, ``unloaded``...), "" if not listed."""
    for entry in data.get("data", []):
        if isinstance(entry, dict) and entry.get("id") == model:
            status = entry.get("status")
            if isinstance(status, dict):
                return str(status.get("value", ""))
    return ""


def parse_props(data: dict[str, Any]) -> Props:
    """The compared fields of ``/props``; raises MalformedAnswer naming what is missing."""
    if data.get("role") == "router":
        raise MalformedAnswer("/props answered the router's own stub, not the model's")
    settings = data.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    template = data.get("chat_template")
    slots = data.get("total_slots")
    if not isinstance(n_ctx, int) or not isinstance(slots, int):
        raise MalformedAnswer("/props has no default_generation_settings.n_ctx or total_slots")
    if not isinstance(template, str):
        raise MalformedAnswer("/props has no chat_template")
    tool_use = data.get("chat_template_tool_use")
    caps = data.get("chat_template_caps")
    return Props(
        build_info=str(data.get("build_info", "")),
        model_alias=str(data.get("model_alias", "")),
        chat_template=template,
        tool_use_template=tool_use if isinstance(tool_use, str) and tool_use else None,
        caps={str(k): v for k, v in caps.items() if isinstance(v, bool)}
        if isinstance(caps, dict)
        else {},
        n_ctx_per_slot=n_ctx,
        total_slots=slots,
    )


def parse_slots(data: list[dict[str, Any]]) -> tuple[SlotInfo, ...]:
    slots: list[SlotInfo] = []
    for entry in data:
        slot_id, n_ctx = entry.get("id"), entry.get("n_ctx")
        if not isinstance(slot_id, int) or not isinstance(n_ctx, int):
            raise MalformedAnswer(f"/slots entry without an integer id and n_ctx: {entry!r:.200}")
        slots.append(SlotInfo(slot_id, n_ctx, bool(entry.get("is_processing"))))
    return tuple(slots)


class StreamTally:
    """Counts what one stream carried, on top of the assembler that folds it."""

    def __init__(self) -> None:
        self.assembler = StreamAssembler()
        self.progress_events = 0
        self.timings_events = 0
        self._token_counts: set[int] = set()

    def apply(self, event: StreamEvent) -> None:
        self.assembler.apply(event)
        if isinstance(event, Progress):
            self.progress_events += 1
        elif isinstance(event, Timings):
            self.timings_events += 1
            self._token_counts.add(event.predicted_n)

    @property
    def generating(self) -> bool:
        """The first token is out: the completion is live and the control call can find it."""
        return any(n > 0 for n in self._token_counts) or bool(
            self.assembler.content or self.assembler.reasoning or self.assembler.tool_calls
        )

    def result(self, slot: int, control_answer: str | None, failure: str) -> StreamProbe:
        asm = self.assembler
        if not failure and asm.server_error is not None:
            failure = f"the server reported an error mid-stream: {asm.server_error.message}"
        elif not failure and asm.problems:
            failure = f"malformed stream: {asm.problems[0]}"
        return StreamProbe(
            slot=slot,
            progress_events=self.progress_events,
            timings_events=self.timings_events,
            token_counts=len(self._token_counts),
            control_answer=control_answer,
            complete=asm.done and not asm.problems and asm.server_error is None,
            failure=failure,
        )
