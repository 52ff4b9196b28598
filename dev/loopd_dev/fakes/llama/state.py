"""The fake server's state: its models (slots, scripts, live completions), faults, pace and log."""

import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .engine import Pace
from .errors import invalid_request
from .faults import FaultBoard
from .model import Generation, ScriptedModel, ScriptedReply, random_id
from .render import TemplateOptions
from .slots import SlotPool

DEFAULT_BUILD = "b11434-5e1d3f0"


@dataclass(frozen=True)
class ModelSpec:
    """One model the fake serves: its id, slots, context per slot and template switches.

    ``host_cache_tokens`` is the host prompt cache's room per slot (0: ``--cache-ram 0``).
    """

    name: str = "fake-model"
    n_slots: int = 2
    n_ctx: int = 8192
    template: TemplateOptions = field(default_factory=TemplateOptions)
    loaded: bool = True
    host_cache_tokens: int = 65536


@dataclass
class LiveCompletion:
    """A completion that holds a slot: what the control endpoint can reach."""

    generation: Generation
    armed: bool


@dataclass
class RequestRecord:
    """One request as the fake saw it; tests read these from ``fake.log`` or ``GET /_fake/log``."""

    seq: int
    method: str
    path: str
    body: Any = None
    model: str | None = None
    completion_id: str | None = None
    slot: int | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    status: int | None = None
    finish_reason: str | None = None
    outcome: str = "pending"  # ok, error, queued-then-gone, disconnected, dropped, error-event

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ModelInstance:
    """A loaded (or loadable) model: its slots, scripted replies and live completions."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.slots = SlotPool(spec.n_slots, spec.n_ctx, spec.host_cache_tokens)
        self.script = ScriptedModel(thinking=spec.template.thinking)
        self.live: dict[str, LiveCompletion] = {}
        self.loaded = spec.loaded
        self.created = int(time.time())
        self.last_used = 0

    @property
    def name(self) -> str:
        return self.spec.name


class FakeLlama:
    """A llama-server stand-in: router mode by default, or one model in single-model mode."""

    def __init__(
        self,
        models: Sequence[ModelSpec] = (ModelSpec(),),
        *,
        router: bool = True,
        pace: Pace | None = None,
        build_info: str = DEFAULT_BUILD,
        seed: int = 0,
        sse_ping_interval: float = 30,
        models_max: int | None = None,
    ) -> None:
        if not models:
            raise ValueError("the fake needs at least one model")
        if not router and len(models) != 1:
            raise ValueError("single-model mode serves exactly one model")
        self.router = router
        self.models_max = models_max  # the router's --models-max; None: no limit
        self._use_clock = itertools.count(1)
        self.models = {spec.name: ModelInstance(spec) for spec in models}
        if models_max is not None:
            # The router never holds more than models_max: the rest start unloaded.
            for instance in [m for m in self.models.values() if m.loaded][models_max:]:
                instance.loaded = False
        self.pace = pace or Pace()
        self.build_info = build_info
        self.sse_ping_interval = sse_ping_interval
        self.faults = FaultBoard(on_cold=self._forget_caches)
        self.log: list[RequestRecord] = []
        self.rng = random.Random(seed)
        self._task_ids = itertools.count()
        self.on_die: Callable[[], None] | None = None

    def model(self, name: str | None = None) -> ModelInstance:
        """A model by name, or the first one."""
        if name is None:
            return next(iter(self.models.values()))
        return self.models[name]

    def push(self, *replies: ScriptedReply, model: str | None = None) -> None:
        """Queue replies the model will give, in order, before falling back to its default."""
        self.model(model).script.push(*replies)

    def select(self, name: str | None, *, autoload: bool = True) -> ModelInstance:
        """Route a request as the router does; single-model mode ignores the name."""
        if not self.router:
            return self.model()
        if not name:
            raise invalid_request("model name is missing from the request")
        instance = self.models.get(name)
        if instance is None:
            raise invalid_request(f"model '{name}' not found")
        if not instance.loaded and not autoload:
            raise invalid_request("model is not loaded")
        if not instance.loaded:
            self._make_room()
        instance.loaded = True
        instance.last_used = next(self._use_clock)
        return instance

    def _make_room(self) -> None:
        """Unload least recently used idle models until one more fits; their caches are lost."""
        if self.models_max is None:
            return
        loaded = [m for m in self.models.values() if m.loaded]
        idle = sorted((m for m in loaded if not m.live), key=lambda m: m.last_used)
        while len(loaded) >= self.models_max and idle:
            victim = idle.pop(0)
            victim.loaded = False
            victim.slots.clear_caches()
            loaded.remove(victim)

    def find_live(self, completion_id: str) -> LiveCompletion | None:
        for instance in self.models.values():
            if completion_id in instance.live:
                return instance.live[completion_id]
        return None

    def new_completion_id(self) -> str:
        return "chatcmpl-" + random_id(self.rng)

    def new_call_ids(self, n: int) -> list[str]:
        return [random_id(self.rng) for _ in range(n)]

    def next_task_id(self) -> int:
        return next(self._task_ids)

    def record(self, method: str, path: str, body: Any = None) -> RequestRecord:
        entry = RequestRecord(len(self.log), method, path, body)
        self.log.append(entry)
        return entry

    def chat_records(self) -> list[RequestRecord]:
        """The log's chat completion requests, oldest first."""
        return [r for r in self.log if r.path.endswith("/chat/completions")]

    def _forget_caches(self) -> None:
        for instance in self.models.values():
            instance.slots.clear_caches()

    def select_for_get(self, query: dict[str, str]) -> ModelInstance:
        autoload = query.get("autoload", "true") != "false"
        return self.select(query.get("model"), autoload=autoload)
