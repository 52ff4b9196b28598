"""What loopd expects of llama-server, per endpoint: load, save and diff the expectations file.

The values are what the server reported when someone last recorded them on purpose with
``loopd selftest --record``; the self-test refuses a server that differs. They are keyed by
endpoint: ``endpoints/<name>.json`` under the folder holds what the server of the
``[[endpoint]]`` table ``name`` reported, since two servers of one model may differ (context,
slots, build). An endpoint with no file of its own is checked against its model's file,
``<model>.json`` (the files in ``loopd/data/expected/``, in the repository and reviewed like
code), and the one-server shorthand (``LOOPD_INFER_URL``) always is. Pure, apart from the
functions that read and write the files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopd.datafiles import EXPECTED_DIR
from loopd.engine.modelstate import Weights
from loopd.errors import LoopdError
from loopd.selftest.template import TemplateAnswer

DEFAULT_DIR = EXPECTED_DIR

# Model ids may hold '/' or ':' (``org/name:Q4_K_M``); file names may not.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_BUILD_NUMBER = re.compile(r"^b(\d+)(?:-|$)")


class ExpectationsError(LoopdError):
    """The expectations file exists but cannot be read or does not hold what it should."""


class ModelExpectation(BaseModel):
    """The recorded facts about one model on the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="The model id loopd sends (router mode selects by it).")
    endpoint: str | None = Field(
        default=None,
        description="The `[[endpoint]]` whose server this records; None: any server of the "
        "model (a per-model file).",
    )
    build: int = Field(description="llama.cpp build number, the digits of `build_info`.")
    build_info: str = Field(description="`/props` build_info as recorded, for people to read.")
    template_sha256: str = Field(description="See `loopd.selftest.template.template_sha256`.")
    template_bytes: int = Field(description="Length of `chat_template` in UTF-8 bytes.")
    n_ctx_per_slot: int = Field(description="`/props` default_generation_settings.n_ctx.")
    total_slots: int = Field(description="`/props` total_slots (the server's `--parallel`).")
    caps: dict[str, bool] | None = Field(
        default=None,
        description="`/props` chat_template_caps. None: not recorded (an expectation written "
        "from the inference contract, which records the template's hash but not its caps).",
    )
    idle_slots_cleared: bool | None = Field(
        default=None,
        description="Whether a slot's prompt is gone once a request has run on another slot: "
        "a unified KV pool with `--cache-idle-slots` (the server's default) saves idle slots "
        "to the host cache and clears them at every task launch. None: not recorded.",
    )
    weights: Weights | None = Field(
        default=None,
        description="What the server reports of the model's file (its name, type, size and "
        "shape) and of the arguments that give a saved state its meaning "
        "(`loopd.engine.modelstate.Weights`). None: not recorded.",
    )
    fingerprint: str | None = Field(
        default=None,
        description="The model id, its weights and its template's sha256, hashed: what a "
        "durable save's name is bound to (`loopd.engine.modelstate.fingerprint`).",
    )
    durable_available: bool | None = Field(
        default=None,
        description="Whether a slot saved to the server's disk and restored came back whole "
        "(the server runs with `--slot-save-path`): what `LOOPD_DURABLE=auto` goes by where the "
        "self-test does not run (`loopd chat`, `loopd run`). None: not recorded.",
    )

    @property
    def answers(self) -> ServerAnswers:
        """What the recording says of the server, as a self-test would answer it."""
        return ServerAnswers(self.idle_slots_cleared, self.durable_available)


@dataclass(frozen=True)
class ServerAnswers:
    """What is known of a server's behaviour, from a self-test run or its recording: whether idle
    slots are cleared (the pinning rule, ``loopd.engine.pinning``), whether a slot's save and
    restore round-trip (durable sessions, ``loopd.engine.durable``), and whether the template
    keeps past reasoning (the cache-loss rule; never recorded). None or UNKNOWN: not known."""

    idle_slots_cleared: bool | None = None
    durable_available: bool | None = None
    keeps_past_reasoning: TemplateAnswer = TemplateAnswer.UNKNOWN


def recorded_answers(
    model: str, endpoint: str | None, directory: Path = DEFAULT_DIR
) -> ServerAnswers | None:
    """The answers recorded for the endpoint's server (``find_expectation``: its own file, else
    its model's); None when nothing is recorded or the file cannot be read (the self-test says
    why where it runs)."""
    try:
        expected, _ = find_expectation(model, endpoint, directory)
    except ExpectationsError:
        return None
    return expected.answers if expected is not None else None


@dataclass(frozen=True)
class FieldChange:
    """One difference between the recorded expectation and a new one."""

    field: str
    old: object
    new: object

    def describe(self) -> str:
        return f"{self.field}: {_show(self.old)} -> {_show(self.new)}"


def build_number(build_info: str) -> int | None:
    """The build number in ``build_info``: ``b11434-pypi-sdist`` -> 11434; None if there is none.

    Only the number is compared: the part after it names how the server was built (a git commit,
    or ``pypi-sdist`` for a build from the source package), which differs between packagings of
    the same build.
    """
    match = _BUILD_NUMBER.match(build_info.strip())
    return int(match.group(1)) if match else None


ENDPOINTS_FOLDER = "endpoints"


def expectation_path(model: str, directory: Path = DEFAULT_DIR) -> Path:
    """The model's file: what any server of ``model`` is expected to report."""
    return directory / f"{_UNSAFE.sub('_', model)}.json"


def endpoint_expectation_path(endpoint: str, directory: Path = DEFAULT_DIR) -> Path:
    """The endpoint's file: what the server of the ``[[endpoint]]`` table is expected to report
    (endpoint names are safe in a file name: ``loopd.config.ENDPOINT_NAME_PATTERN``)."""
    return directory / ENDPOINTS_FOLDER / f"{_UNSAFE.sub('_', endpoint)}.json"


def record_path(model: str, endpoint: str | None, directory: Path = DEFAULT_DIR) -> Path:
    """Where ``--record`` writes: the endpoint's file, or the model's for the shorthand."""
    if endpoint is None:
        return expectation_path(model, directory)
    return endpoint_expectation_path(endpoint, directory)


def find_expectation(
    model: str, endpoint: str | None, directory: Path = DEFAULT_DIR
) -> tuple[ModelExpectation | None, Path]:
    """The expectation the self-test checks the endpoint's server against, and its file: the
    endpoint's own when recorded, else the model's. (None, where ``--record`` would write it)
    when neither was ever recorded."""
    if endpoint is not None:
        path = endpoint_expectation_path(endpoint, directory)
        own = _read(path)
        if own is not None:
            if own.endpoint != endpoint:
                raise ExpectationsError(
                    f"{path}: records endpoint {own.endpoint!r}, not {endpoint!r}"
                )
            if own.model != model:
                raise ExpectationsError(
                    f"{path}: records model {own.model!r}, but endpoint {endpoint} now serves "
                    f"{model!r}; record it again (loopd selftest --record --endpoint {endpoint})"
                )
            return own, path
    fallback = load_expectation(model, directory)
    if fallback is not None:
        return fallback, expectation_path(model, directory)
    return None, record_path(model, endpoint, directory)


def load_expectation(model: str, directory: Path = DEFAULT_DIR) -> ModelExpectation | None:
    """The recorded expectation of the model's file, or None when none was ever recorded."""
    path = expectation_path(model, directory)
    expectation = _read(path)
    if expectation is not None and expectation.model != model:
        raise ExpectationsError(f"{path}: records model {expectation.model!r}, not {model!r}")
    return expectation


def _read(path: Path) -> ModelExpectation | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"{path}: cannot read the expectations file: {exc}") from exc
    try:
        return ModelExpectation.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise ExpectationsError(f"{path}: {where}: {first['msg']}") from exc


def save_expectation(expectation: ModelExpectation, directory: Path = DEFAULT_DIR) -> Path:
    """Write the file (stable key order, one field a line, so a change reads well in a diff):
    the endpoint's when the expectation names one, else the model's."""
    path = record_path(expectation.model, expectation.endpoint, directory)
    # A model's file has no endpoint key, as it had before endpoints were recorded.
    fields = expectation.model_dump(exclude={"endpoint"} if expectation.endpoint is None else None)
    text = json.dumps(fields, indent=2, sort_keys=False) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ExpectationsError(f"{path}: cannot write the expectations file: {exc}") from exc
    return path


def diff_expectations(old: ModelExpectation | None, new: ModelExpectation) -> list[FieldChange]:
    """Field by field, in the file's order; every field is new when nothing was recorded."""
    before = old.model_dump() if old is not None else {}
    changes: list[FieldChange] = []
    for name, value in new.model_dump().items():
        if name == "caps" and isinstance(value, dict):
            changes.extend(_diff_caps(before.get("caps"), value))
        elif before.get(name) != value:
            changes.append(FieldChange(name, before.get(name), value))
    return changes


def _diff_caps(old: object, new: dict[str, bool]) -> list[FieldChange]:
    recorded: dict[str, object] = old if isinstance(old, dict) else {}
    names = list(new) + [name for name in recorded if name not in new]
    return [
        FieldChange(f"caps.{name}", recorded.get(name), new.get(name))
        for name in names
        if recorded.get(name) != new.get(name)
    ]


def _show(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
