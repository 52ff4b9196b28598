"""What the server tells of loopd's model without waking it: asleep, loaded, restarted, and
which weights it runs. Pure; ``InferenceClient.model_reading`` asks (``GET /models`` and
``GET /props?autoload=false``, both answered asleep: ``loopd.engine.quiet``).

- **Its state** (``ModelStatus``): the router lists each model's status (``loaded``,
  ``sleeping``, ``unloaded``, ``loading``...); a single-model server says ``is_sleeping`` in
  ``/props``. Measured on build 11434: a sleeping model's ``/props`` still answers its template
  and file, and ``/models`` its file's figures.
- **One start from the next** (``ModelReading.instance``): the router starts each model's child
  on a port of its own, listed in the model's arguments; a new port is a new process, which holds
  nothing of the old one's caches. A sleep keeps the process (and the port).
- **Its weights** (``Weights``, ``fingerprint``): the file's name and type, its size and shape
  as the server reports them, and the few arguments that change what a saved state means (a KV
  cache type, an override of the model's keys, a LoRA). With the template's sha256, they make
  the fingerprint a durable save is bound to (``loopd.engine.durable``): a save is never
  restored into other weights, where the restore would be answered with success and the tokens
  would match while the state is another model's. The file's folder is left out (it differs
  between machines); weights replaced in place by others of the same name, type and shape are
  not told apart: the server reports nothing that differs.
- **When it forgot** (``ModelMemory``): every sleep, unload or restart seen between two
  readings, counted, so that a turn that starts after one restores its session's save before
  its request instead of learning the loss from the request's first progress event.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

from loopcommon.slotfiles import FINGERPRINT_HEX


class ModelStatus(StrEnum):
    AWAKE = "awake"  # loaded and not asleep: holds its caches
    ASLEEP = "asleep"
    UNLOADED = "unloaded"
    LOADING = "loading"
    UNKNOWN = "unknown"  # the server said nothing that tells

    @property
    def holds_nothing(self) -> bool:
        """The model holds no cache now: its sessions' next requests start from nothing."""
        return self in {ModelStatus.ASLEEP, ModelStatus.UNLOADED, ModelStatus.LOADING}


# The router's words (``/models`` ``status.value``) for each state.
ROUTER_STATUS: Final[Mapping[str, ModelStatus]] = {
    "loaded": ModelStatus.AWAKE,
    "sleeping": ModelStatus.ASLEEP,
    "unloaded": ModelStatus.UNLOADED,
    "loading": ModelStatus.LOADING,
    "downloading": ModelStatus.UNLOADED,
    "downloaded": ModelStatus.UNLOADED,
}

SLEEP_FLAG: Final = "--sleep-idle-seconds"
PORT_FLAG: Final = "--port"
# The arguments that change what a saved state means, beside the file: its values' types, the
# model's own keys, adapters, the positions' scaling.
STATE_FLAGS: Final = frozenset(
    {
        "--override-kv",
        "--cache-type-k",
        "-ctk",
        "--cache-type-v",
        "-ctv",
        "--lora",
        "--lora-scaled",
        "--control-vector",
        "--control-vector-scaled",
        "--rope-scaling",
        "--rope-scale",
        "--rope-freq-base",
        "--rope-freq-scale",
        "--swa-full",
    }
)


def template_sha256(chat_template: str, tool_use_template: str | None) -> str:
    """sha256 (hex) of ``chat_template``; with a separate tool-use template, of both.

    Without a tool-use template this is the plain sha256 of the template's UTF-8 bytes, the figure
    an operator gets from ``sha256sum`` of the template file. The record separator keeps
    ("ab", "c") and ("a", "bc") apart.
    """
    digest = hashlib.sha256(chat_template.encode("utf-8"))
    if tool_use_template is not None:
        digest.update(b"\x1e")
        digest.update(tool_use_template.encode("utf-8"))
    return digest.hexdigest()


@dataclass(frozen=True)
class Weights:
    """What the server reports of the model's file, and the arguments that give a state its
    meaning (``STATE_FLAGS``, each with its value, in the order given)."""

    file: str
    ftype: str
    size: int | None = None
    n_params: int | None = None
    n_vocab: int | None = None
    n_embd: int | None = None
    n_ctx_train: int | None = None
    args: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for people: ``SmolLM2.gguf (Q4_1, 96,576,768 bytes, 134,515,008 params)``."""
        parts = [self.ftype or "type unknown"]
        if self.size is not None:
            parts.append(f"{self.size:,} bytes")
        if self.n_params is not None:
            parts.append(f"{self.n_params:,} params")
        parts.extend(self.args)
        return f"{self.file or '(no file named)'} ({', '.join(parts)})"


def fingerprint(model: str, weights: Weights, template: str) -> str:
    """The hex fingerprint a save is bound to: the model id, its weights and its template's
    sha256 (``template``)."""
    text = json.dumps([model, asdict(weights), template], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:FINGERPRINT_HEX]


@dataclass(frozen=True)
class ModelReading:
    """One look at the model, taken without waking it."""

    status: ModelStatus
    instance: str | None = None  # tells one start of the model's process from the next
    sleep_idle_s: int | None = None  # the idle policy: asleep after this long; None: not told
    weights: Weights | None = None
    template: str | None = None  # the template's sha256
    detail: str = ""  # why the status is unknown

    def fingerprint(self, model: str) -> str | None:
        if self.weights is None or self.template is None:
            return None
        return fingerprint(model, self.weights, self.template)


def listed(data: Mapping[str, Any], model: str) -> Mapping[str, Any] | None:
    """``model``'s entry in a ``/models`` answer (by id or alias); a single-model server's one
    entry (it serves whatever name a request gives); else None."""
    raw = data.get("data")
    entries = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    for entry in entries:
        aliases = entry.get("aliases")
        names = [entry.get("id"), *(aliases if isinstance(aliases, list) else [])]
        if model in names:
            return entry
    if len(entries) == 1 and "status" not in entries[0]:
        return entries[0]
    return None


def _flag(args: Sequence[object], flag: str) -> str | None:
    """The value after the last ``flag`` in ``args``."""
    value = None
    for name, after in itertools.pairwise(args):
        if name == flag and isinstance(after, str):
            value = after
    return value


def _state_args(args: Sequence[object]) -> tuple[str, ...]:
    out: list[str] = []
    for at, name in enumerate(args):
        if isinstance(name, str) and name in STATE_FLAGS:
            after = args[at + 1] if at + 1 < len(args) else None
            valued = isinstance(after, str) and not after.startswith("--")
            out.append(f"{name} {after}" if valued else name)
    return tuple(out)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_reading(
    models: Mapping[str, Any] | None, props: Mapping[str, Any] | None, model: str
) -> ModelReading:
    """The reading from a ``/models`` answer (the router's; None where it gave none) and a
    ``/props?model=...&autoload=false`` answer (None where it was refused: the model is not
    loaded). Hostile or partial answers give what they hold, never an error."""
    entry = listed(models, model) if models is not None else None
    status_obj = entry.get("status") if entry is not None else None
    status = ModelStatus.UNKNOWN
    args: list[object] = []
    if isinstance(status_obj, dict):
        status = ROUTER_STATUS.get(str(status_obj.get("value", "")), ModelStatus.UNKNOWN)
        raw_args = status_obj.get("args")
        args = list(raw_args) if isinstance(raw_args, list) else []
    if props is not None and status in {ModelStatus.UNKNOWN, ModelStatus.AWAKE}:
        sleeping = props.get("is_sleeping")
        if isinstance(sleeping, bool):
            status = ModelStatus.ASLEEP if sleeping else ModelStatus.AWAKE
    sleep = _flag(args, SLEEP_FLAG)
    sleep_idle_s = int(sleep) if sleep is not None and sleep.lstrip("-").isdigit() else None
    template = None
    if props is not None and isinstance(props.get("chat_template"), str):
        tool_use = props.get("chat_template_tool_use")
        template = template_sha256(
            props["chat_template"], tool_use if isinstance(tool_use, str) and tool_use else None
        )
    return ModelReading(
        status=status,
        instance=_flag(args, PORT_FLAG),
        sleep_idle_s=sleep_idle_s,
        weights=_weights(entry, props, args),
        template=template,
    )


def _weights(
    entry: Mapping[str, Any] | None, props: Mapping[str, Any] | None, args: Sequence[object]
) -> Weights | None:
    meta = entry.get("meta") if entry is not None else None
    meta = meta if isinstance(meta, dict) else {}
    path = props.get("model_path") if props is not None else None
    if not isinstance(path, str) or not path:
        path = _flag(args, "--model") or _flag(args, "-m")
    if path is None and not meta:
        return None
    ftype = props.get("model_ftype") if props is not None else None
    if not isinstance(ftype, str):
        ftype = str(meta.get("ftype", ""))
    return Weights(
        file=(path or "").replace("\\", "/").rsplit("/", 1)[-1],
        ftype=ftype,
        size=_int(meta.get("size")),
        n_params=_int(meta.get("n_params")),
        n_vocab=_int(meta.get("n_vocab")),
        n_embd=_int(meta.get("n_embd")),
        n_ctx_train=_int(meta.get("n_ctx_train")),
        args=_state_args(args),
    )


class Forgot(StrEnum):
    """How the model lost what it held."""

    SLEPT = "the model slept"
    UNLOADED = "the model was unloaded"
    RESTARTED = "the model restarted"


def forgot(before: ModelReading | None, now: ModelReading) -> Forgot | None:
    """What the model lost between two readings (``before`` None: the first reading, where a
    model that holds nothing now has lost whatever it held)."""
    if now.status is ModelStatus.UNKNOWN:
        return None
    was = before.status if before is not None else None
    if now.status is ModelStatus.ASLEEP:
        return None if was is ModelStatus.ASLEEP else Forgot.SLEPT
    if now.status in {ModelStatus.UNLOADED, ModelStatus.LOADING}:
        gone = was in {ModelStatus.UNLOADED, ModelStatus.LOADING}
        return None if gone else Forgot.UNLOADED
    # Awake now: a new process where the last reading saw another one awake.
    if (
        before is not None
        and was is ModelStatus.AWAKE
        and before.instance is not None
        and now.instance is not None
        and before.instance != now.instance
    ):
        return Forgot.RESTARTED
    return None


@dataclass
class ModelMemory:
    """The readings loopd took of its model, and how often the model forgot since loopd started
    (``forgets``: a save made at one count is lost once the count grows)."""

    last: ModelReading | None = None
    forgets: int = 0
    last_forget: Forgot | None = None
    # A watch reads the model in the background (``loopd serve``'s server watch), so a turn
    # need not read it before it starts.
    watched: bool = False

    # The latest reading that told the weights and the template (a model not loaded tells
    # neither): the fingerprint a turn checks a save against until it reads the model again.
    known: ModelReading | None = None
    # Per session, ``forgets`` when its slot last held its state (its save, or a turn's end):
    # once the count grows, the model forgot it since (``loopd.turn.saves``).
    held_at: dict[str, int] = field(default_factory=dict)

    def observe(self, reading: ModelReading) -> Forgot | None:
        """Take a reading; what the model lost since the last one, if anything."""
        if reading.status is ModelStatus.UNKNOWN:
            return None
        lost = forgot(self.last, reading)
        self.last = reading
        if reading.weights is not None and reading.template is not None:
            self.known = reading
        if lost is not None:
            self.forgets += 1
            self.last_forget = lost
        return lost

    @property
    def status(self) -> ModelStatus:
        return self.last.status if self.last is not None else ModelStatus.UNKNOWN
