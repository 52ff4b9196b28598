"""What loopd expects of llama-server, per model: load, save and diff the expectations file.

One JSON file per model under ``loopd/data/expected/`` (in the repository, reviewed like code).
The values are what the server reported when someone last recorded them on purpose with
``loopd selftest --record``; the self-test refuses a server that differs. Pure, apart from the
two functions that read and write the file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopd.errors import LoopdError

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "data" / "expected"

# Model ids may hold '/' or ':' (``org/name:Q4_K_M``); file names may not.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_BUILD_NUMBER = re.compile(r"^b(\d+)(?:-|$)")


class ExpectationsError(LoopdError):
    """The expectations file exists but cannot be read or does not hold what it should."""


class ModelExpectation(BaseModel):
    """The recorded facts about one model on the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="The model id loopd sends (router mode selects by it).")
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


def expectation_path(model: str, directory: Path = DEFAULT_DIR) -> Path:
    return directory / f"{_UNSAFE.sub('_', model)}.json"


def load_expectation(model: str, directory: Path = DEFAULT_DIR) -> ModelExpectation | None:
    """The recorded expectation for ``model``, or None when none was ever recorded."""
    path = expectation_path(model, directory)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"{path}: cannot read the expectations file: {exc}") from exc
    try:
        expectation = ModelExpectation.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise ExpectationsError(f"{path}: {where}: {first['msg']}") from exc
    if expectation.model != model:
        raise ExpectationsError(f"{path}: records model {expectation.model!r}, not {model!r}")
    return expectation


def save_expectation(expectation: ModelExpectation, directory: Path = DEFAULT_DIR) -> Path:
    """Write the file (stable key order, one field a line, so a change reads well in a diff)."""
    path = expectation_path(expectation.model, directory)
    text = json.dumps(expectation.model_dump(), indent=2, sort_keys=False) + "\n"
    try:
        directory.mkdir(parents=True, exist_ok=True)
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
