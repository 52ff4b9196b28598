"""Loading and checking the tools file."""

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from loopcommon.jsonbytes import dumps
from loopd.datafiles import CORE_TOOLS_FILE
from loopd.tools import ToolsSpec, ToolsSpecError, load_tools_spec, parse_tools_spec
from loopd.tools.core import CORE_TOOL_NAMES, check_spec_runnable


def tool(name: str, **parameters: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": {}, **parameters}
    return {
        "type": "function",
        "function": {"name": name, "description": "d", "parameters": schema},
    }


def write(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value))
    return path


def test_the_repository_file_declares_the_core_set_and_the_broker_tools(spec: ToolsSpec) -> None:
    assert spec.names == (
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "search_files",
        "run_command",
        "find_tool",
        "call_tool",
    )
    assert set(spec.schemas) == set(spec.names)
    assert spec.schemas["call_tool"]["properties"]["arguments"] == {"type": "object"}
    check_spec_runnable(spec)
    assert set(spec.names) >= CORE_TOOL_NAMES


def test_the_shipped_file_passes_the_check_its_start_leaves_out() -> None:
    # loopd's own file is read at each start without checking its schemas against JSON
    # Schema's rules (that needs jsonschema, slow to import): this is where they are checked.
    raw = CORE_TOOLS_FILE.read_text(encoding="utf-8")
    whole = parse_tools_spec(raw, source="shipped", check_schemas=True)
    assert load_tools_spec(CORE_TOOLS_FILE) == whole
    broken = raw.replace('"type": "string"', '"type": "strin"', 1)
    assert broken != raw
    with pytest.raises(ToolsSpecError, match="not a valid JSON Schema"):
        parse_tools_spec(broken, source="shipped", check_schemas=True)


def test_another_file_is_checked_whole_at_each_start(tmp_path: Path) -> None:
    # The same text under another name (an operator's copy) is checked as any file is.
    copy = tmp_path / "tools.json"
    raw = CORE_TOOLS_FILE.read_text(encoding="utf-8")
    copy.write_text(raw.replace('"type": "string"', '"type": "strin"', 1), encoding="utf-8")
    with pytest.raises(ToolsSpecError, match="not a valid JSON Schema"):
        load_tools_spec(copy)


def test_text_is_dumps_of_the_parsed_file_and_sha256_is_over_it(
    spec: ToolsSpec, tools_file: Path
) -> None:
    parsed = json.loads(tools_file.read_text())
    assert spec.text == dumps(parsed)
    assert spec.sha256 == hashlib.sha256(spec.text.encode("utf-8")).hexdigest()


def test_text_does_not_depend_on_how_the_file_is_formatted(
    spec: ToolsSpec, tools_file: Path, tmp_path: Path
) -> None:
    reformatted = tmp_path / "tools.json"
    reformatted.write_text(json.dumps(json.loads(tools_file.read_text()), indent=7) + "\n\n")
    again = load_tools_spec(reformatted)
    assert (again.text, again.sha256) == (spec.text, spec.sha256)
    assert load_tools_spec(tools_file) == spec


def test_non_ascii_text_is_kept_as_utf8() -> None:
    value = [tool("greet")]
    value[0]["function"]["description"] = "sagt grüß"
    spec = parse_tools_spec(json.dumps(value, ensure_ascii=True), source="x")
    assert "sagt grüß" in spec.text
    assert "\\u" not in spec.text


def test_duplicate_names_are_refused_naming_file_and_tool(tmp_path: Path) -> None:
    path = write(tmp_path / "tools.json", [tool("read_file"), tool("other"), tool("read_file")])
    with pytest.raises(ToolsSpecError, match=r"tools\.json: tool 'read_file' is declared twice"):
        load_tools_spec(path)


def test_an_invalid_parameters_schema_is_refused_naming_the_tool(tmp_path: Path) -> None:
    bad = tool("broken", properties={"x": {"type": "strin"}})
    path = write(tmp_path / "tools.json", [tool("fine"), bad])
    with pytest.raises(ToolsSpecError) as caught:
        load_tools_spec(path)
    message = str(caught.value)
    assert str(path) in message
    assert "tool #1 (broken)" in message
    assert "not a valid JSON Schema at properties/x/type" in message


def test_not_json_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text('[{"type": "function",')
    with pytest.raises(ToolsSpecError, match=rf"{path}: not valid JSON"):
        load_tools_spec(path)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ToolsSpecError, match=r"nope\.json: cannot read the tools file"):
        load_tools_spec(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"tools": []}, "expected a non-empty JSON array"),
        ([], "expected a non-empty JSON array"),
        (["read_file"], 'expected {"type": "function"'),
        ([{"type": "tool", "function": {}}], 'expected {"type": "function"'),
        ([{**tool("t"), "extra": 1}], 'expected {"type": "function"'),
        ([{"type": "function", "function": []}], '"function" must be an object'),
        ([tool("has space")], "name must match"),
        ([tool("x" * 65)], "name must match"),
        ([{"type": "function", "function": {"name": "t", "parameters": {}}}], "exactly the keys"),
        ([{"type": "function", "function": {**tool("t")["function"], "strict": True}}], "exactly"),
        ([{"type": "function", "function": {**tool("t")["function"], "description": " "}}], "desc"),
        ([{"type": "function", "function": {**tool("t")["function"], "parameters": []}}], "object"),
        ([tool("t", type="string")], '"type": "object"'),
        ([tool("t", required="path")], "not a valid JSON Schema at required"),
    ],
)
def test_wrong_shapes_are_refused(value: Any, expected: str) -> None:
    with pytest.raises(ToolsSpecError, match=r"^tools\.json: ") as caught:
        parse_tools_spec(json.dumps(value), source="tools.json")
    assert expected in str(caught.value)


def test_a_declared_tool_that_nothing_runs_is_refused() -> None:
    spec = parse_tools_spec(json.dumps([tool("read_file"), tool("launch_rockets")]), source="x")
    with pytest.raises(ToolsSpecError, match="nothing runs: launch_rockets"):
        check_spec_runnable(spec)
