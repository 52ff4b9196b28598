"""The pure parts of the MCP source: names, result text, tool listings, the [[mcp]] table,
the sandbox's view of an installation."""

import re
from pathlib import Path

import mcp_types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from brokerd.mcp.config import McpServerConfig, parse_path
from brokerd.mcp.names import catalogue_name, original, tool_part
from brokerd.mcp.results import result_text
from brokerd.mcp.sandbox import install_folder, install_folders
from brokerd.mcp.specs import offered_tools
from brokerd.tools.catalogue import MCP_TOOL_NAME_PATTERN

MCP_NAMES = st.text(min_size=1, max_size=128)


@pytest.mark.parametrize(
    ("mcp_name", "written"),
    [
        ("get_current_time", "get_current_time"),
        ("get-sum", "get-sum"),
        ("getSum", "getsum__3h53"),
        ("tools.v2", "tools_v2__5h2e"),
        ("a__b", "a__b__"),
        ("x.", "x___1h2e"),
        ("é", "___0he9"),
    ],
)
def test_tool_names_are_written_readably(mcp_name: str, written: str) -> None:
    assert tool_part(mcp_name) == written
    assert original(written) == mcp_name


@given(MCP_NAMES)
def test_the_name_mapping_is_inverted_by_original(mcp_name: str) -> None:
    written = tool_part(mcp_name)
    assert original(written) == mcp_name
    assert re.fullmatch(MCP_TOOL_NAME_PATTERN, catalogue_name("server", mcp_name))


@given(MCP_NAMES, MCP_NAMES)
def test_two_names_never_share_a_catalogue_name(first: str, second: str) -> None:
    if first != second:
        assert tool_part(first) != tool_part(second)


def test_an_overlong_name_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 128 characters"):
        tool_part("a" * 129)


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def test_text_content_is_kept_and_structured_content_is_json() -> None:
    both = types.CallToolResult(
        content=[text("line one"), text("two")], structured_content={"a": 1}
    )
    assert result_text(both).text == "line one\ntwo"
    alone = types.CallToolResult(content=[], structured_content={"a": [1, "é"]})
    assert result_text(alone).text == '{"a":[1,"é"]}'


def test_images_and_resources_are_one_line_each() -> None:
    result = types.CallToolResult(
        content=[
            types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png"),
            types.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
            types.ResourceLink(
                type="resource_link", name="a\nb", uri="file:///x", mime_type="text/plain"
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="mem://n", mime_type="text/plain", text="four"
                ),
            ),
            types.EmbeddedResource(
                type="resource", resource=types.BlobResourceContents(uri="mem://b", blob="AAAAAA==")
            ),
        ],
        is_error=True,
    )
    mapped = result_text(result)
    assert mapped.is_error
    assert mapped.text.splitlines() == [
        '[image: "image/png", 5 bytes, not shown]',
        '[audio: "audio/wav", 3 bytes, not shown]',
        '[resource link: "a\\nb" at "file:///x", "text/plain"]',
        '[resource: "mem://n", "text/plain", 4 bytes of text, not shown]',
        '[resource: "mem://b", 4 bytes, not shown]',
    ]


OBJECT: dict[str, object] = {"type": "object", "properties": {"q": {"type": "string"}}}


def tool(
    name: str, schema: dict[str, object] = OBJECT, description: str | None = "A tool."
) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema)


def test_a_listing_offers_allowed_tools_and_names_what_it_skips() -> None:
    config = McpServerConfig(
        name="srv", command=("/bin/true",), tools=("good", "bad_schema", "not_object", "gone")
    )
    listed = [
        tool("good"),
        tool("other"),
        tool("bad_schema", {"type": "object", "properties": {"q": {"type": 3}}}),
        tool("not_object", {"type": "string"}),
    ]
    offered = offered_tools(config, listed)
    assert [spec.name for spec in offered.specs] == ["srv.good"]
    assert offered.specs[0].timeout_s == 30.0
    assert len(offered.skipped) == 3
    assert "not a valid JSON Schema" in offered.skipped[0]
    assert "not an object schema" in offered.skipped[1]
    assert offered.skipped[2] == "'gone': in the tools allowlist, but the server does not list it"


def test_a_listing_bounds_descriptions_and_fills_a_missing_one() -> None:
    config = McpServerConfig(name="srv", command=("/bin/true",))
    offered = offered_tools(
        config, [tool("long", description="d" * 5000), tool("none", description=None)]
    )
    by_name = {spec.name: spec for spec in offered.specs}
    assert len(by_name["srv.long"].description) == 2000
    assert by_name["srv.none"].description == "The tool none of srv."


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"name": "x"}, "give either command"),
        ({"name": "x", "command": ["a"], "url": "http://h/mcp"}, "give either command"),
        ({"name": "x", "url": "http://h/mcp", "network": True}, "apply to a stdio server"),
        ({"name": "x.y", "command": ["a"]}, "should match pattern"),
        ({"name": "x", "command": ["a"], "paths": ["relative/dir"]}, "must be absolute"),
        ({"name": "x", "command": ["a"], "paths": ["/a/../b"]}, "must be absolute and normal"),
        ({"name": "x", "command": ["a"], "timeout_s": 0}, "greater than 0"),
        ({"name": "x", "command": ["a"], "shell": True}, "Extra inputs"),
    ],
)
def test_a_bad_mcp_table_is_refused_naming_why(table: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        McpServerConfig.model_validate(table)


def test_paths_are_read_only_unless_declared_rw() -> None:
    assert parse_path("/srv/data").writable is False
    assert parse_path("/srv/data:ro").writable is False
    written = parse_path("/srv/data:rw")
    assert (written.path, written.writable) == (Path("/srv/data"), True)


def test_the_install_folder_of_a_program(tmp_path: Path) -> None:
    assert install_folder(Path("/usr/bin/node")) is None
    assert install_folder(tmp_path / "venv" / "bin" / "server") == tmp_path / "venv"
    npm = tmp_path / "npm" / "node_modules" / "@scope" / "server" / "dist" / "index.js"
    assert install_folder(npm) == tmp_path / "npm"
    assert install_folder(tmp_path / "tools" / "server") == tmp_path / "tools"


def test_a_venv_script_needs_its_venv_and_its_base_interpreter(tmp_path: Path) -> None:
    base = tmp_path / "python3.11"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3").write_text("")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\n")
    (venv / "bin" / "python").symlink_to(base / "bin" / "python3")
    script = venv / "bin" / "server"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport server\n")
    assert install_folders(script, "/usr/bin:/bin") == [venv, base]
