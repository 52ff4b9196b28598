"""Load, check and fingerprint the tools file (``tools.schema.json``).

The server renders the ``tools`` array at the very top of the prompt, so one change to it costs a
full re-read of every session. The array is therefore read once at startup, checked, and turned
into one string (``ToolsSpec.text``) that every request of the epoch sends unchanged. How the file
is formatted on disk does not matter: ``text`` is ``loopcommon.jsonbytes.dumps`` of the parsed
value.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopcommon.jsonbytes import dumps
from loopd.datafiles import CORE_TOOLS_FILE
from loopd.tools.errors import ToolsSpecError

# The names the chat-completions API accepts for a function.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters"})


@dataclass(frozen=True)
class ToolsSpec:
    """The checked tools array of one epoch.

    ``text`` is the exact JSON sent as ``tools`` in every request; ``sha256`` is its fingerprint
    (hex, over the UTF-8 bytes of ``text``); ``names`` are in file order; ``schemas`` maps each
    name to its ``parameters`` JSON Schema, and ``descriptions`` to its description (what a
    person asked to approve a call reads of the tool).
    """

    text: str
    sha256: str
    names: tuple[str, ...]
    schemas: dict[str, dict[str, Any]]
    descriptions: dict[str, str] = field(default_factory=dict)


def load_tools_spec(path: Path) -> ToolsSpec:
    """Read and check the tools file; raise ``ToolsSpecError`` naming the file and the tool.

    The parameters' JSON Schemas of loopd's own file (``CORE_TOOLS_FILE``, in the package) are
    checked by its test (``tests/tools/test_tools_spec.py``), as the code beside it is, not at
    each start: that check imports jsonschema, tens of milliseconds before a command line's first
    request (``make bench``). A file the operator names is checked whole here."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolsSpecError(f"{path}: cannot read the tools file: {exc}") from exc
    shipped = path.resolve() == CORE_TOOLS_FILE
    return parse_tools_spec(raw, source=str(path), check_schemas=not shipped)


def parse_tools_spec(raw: str, source: str, *, check_schemas: bool = True) -> ToolsSpec:
    """Check the text of a tools file; ``source`` names it in error messages. ``check_schemas``
    False leaves out the check of each ``parameters`` against JSON Schema's own rules (the shape
    of the array, the names and the keys are checked still)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolsSpecError(f"{source}: not valid JSON: {exc}") from exc
    schemas = _check_tools_array(value, source, check_schemas=check_schemas)
    text = dumps(value)
    return ToolsSpec(
        text=text,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        names=tuple(schemas),
        schemas=schemas,
        descriptions={tool["function"]["name"]: tool["function"]["description"] for tool in value},
    )


def _check_tools_array(
    value: Any, source: str, *, check_schemas: bool
) -> dict[str, dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ToolsSpecError(f"{source}: expected a non-empty JSON array of tools")
    schemas: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(value):
        name, parameters = _check_tool(tool, f"{source}: tool #{index}", check_schemas)
        if name in schemas:
            raise ToolsSpecError(f"{source}: tool {name!r} is declared twice")
        schemas[name] = parameters
    return schemas


def _check_tool(tool: Any, where: str, check_schemas: bool) -> tuple[str, dict[str, Any]]:
    """Check one entry; return its name and parameters schema."""
    if not isinstance(tool, Mapping) or set(tool) != _TOOL_KEYS or tool["type"] != "function":
        raise ToolsSpecError(f'{where}: expected {{"type": "function", "function": {{...}}}}')
    function = tool["function"]
    if not isinstance(function, Mapping):
        raise ToolsSpecError(f'{where}: "function" must be an object')
    name = function.get("name")
    if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        raise ToolsSpecError(f"{where}: name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    where = f"{where} ({name})"
    if set(function) != _FUNCTION_KEYS:
        keys = ", ".join(sorted(_FUNCTION_KEYS))
        raise ToolsSpecError(f"{where}: the function must have exactly the keys {keys}")
    description = function["description"]
    if not isinstance(description, str) or not description.strip():
        raise ToolsSpecError(f"{where}: description must be a non-empty string")
    return name, _check_parameters(function["parameters"], where, check_schemas)


def _check_parameters(parameters: Any, where: str, check_schemas: bool) -> dict[str, Any]:
    # Arguments always arrive as one JSON object, so anything else could never validate.
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolsSpecError(f'{where}: parameters must be a JSON Schema with "type": "object"')
    if not check_schemas:
        return parameters
    # Imported here, not with the module: loopd's own tools file never needs jsonschema.
    from jsonschema.exceptions import SchemaError

    from loopcommon.schemas import check_schema

    try:
        check_schema(parameters)
    except SchemaError as exc:
        path = "/".join(str(part) for part in exc.path) or "(top)"
        raise ToolsSpecError(
            f"{where}: parameters is not a valid JSON Schema at {path}: {exc.message}"
        ) from exc
    return parameters
