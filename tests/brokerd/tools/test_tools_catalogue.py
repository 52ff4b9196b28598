"""Loading and validating the tool catalogue."""

from pathlib import Path

import pytest

from brokerd.tools.builtins import BUILTINS
from brokerd.tools.catalogue import CommandRun, load_catalogue, parse_tool
from brokerd.tools.errors import CatalogueError
from brokerd.tools.settings import DEFAULT_CATALOGUE_DIR
from tests.brokerd.tools.brokertools_support import OBJECT_SCHEMA, write_tool

BUILTIN_NAMES = BUILTINS.keys()


def test_default_catalogue_loads_with_web_fetch_and_a_limited_host_command() -> None:
    catalogue = load_catalogue(DEFAULT_CATALOGUE_DIR, BUILTIN_NAMES)
    assert len(catalogue) >= 4
    assert "web_fetch" in catalogue.tools
    commands = [spec for spec in catalogue if isinstance(spec.run, CommandRun)]
    assert commands, "the default catalogue ships at least one host command"
    for spec in commands:
        assert spec.timeout_s is not None
        assert spec.output_cap_bytes is not None


def test_toml_tool_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "say.toml").write_text(
        'name = "say"\ndescription = "Say it."\n'
        '[parameters]\ntype = "object"\nrequired = ["word"]\n'
        '[parameters.properties.word]\ntype = "string"\n'
        '[run]\nkind = "command"\nargv = ["echo", "{word}"]\n',
        encoding="utf-8",
    )
    spec = load_catalogue(tmp_path, BUILTIN_NAMES).tools["say"]
    assert isinstance(spec.run, CommandRun)
    assert spec.run.argv == ("echo", "{word}")


def test_files_that_are_not_tools_are_ignored(tmp_path: Path) -> None:
    write_tool(tmp_path, "one")
    (tmp_path / "README.md").write_text("notes", encoding="utf-8")
    assert list(load_catalogue(tmp_path, BUILTIN_NAMES).tools) == ["one"]


def test_invalid_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(CatalogueError, match=r"broken\.json: not valid JSON"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_invalid_json_schema_names_the_file_and_the_place(tmp_path: Path) -> None:
    bad = {"type": "object", "properties": {"n": {"type": "nonsense"}}}
    write_tool(tmp_path, "bad_schema", parameters=bad)
    with pytest.raises(CatalogueError, match=r"bad_schema\.json: parameters is not a valid JSON"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_parameters_must_be_an_object_schema() -> None:
    text = '{"name": "x", "description": "d", "parameters": {"type": "string"},'
    text += ' "run": {"kind": "builtin", "handler": "clock_now"}}'
    with pytest.raises(CatalogueError, match=r"x\.json: parameters must be an object schema"):
        parse_tool("x.json", text, "json", BUILTIN_NAMES)


def test_duplicate_names_name_both_files(tmp_path: Path) -> None:
    write_tool(tmp_path, "twice")
    (tmp_path / "twice.toml").write_text(
        'name = "twice"\ndescription = "d"\n[parameters]\ntype = "object"\n'
        '[run]\nkind = "builtin"\nhandler = "clock_now"\n',
        encoding="utf-8",
    )
    with pytest.raises(CatalogueError, match=r"twice\.toml: .*already declared by .*twice\.json"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_file_name_must_match_tool_name(tmp_path: Path) -> None:
    path = write_tool(tmp_path, "right")
    path.rename(tmp_path / "wrong.json")
    with pytest.raises(CatalogueError, match=r"wrong\.json: declares tool 'right'"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_missing_fields_and_bad_names_are_listed(tmp_path: Path) -> None:
    (tmp_path / "Bad-Name.json").write_text('{"name": "Bad-Name"}', encoding="utf-8")
    with pytest.raises(CatalogueError) as caught:
        load_catalogue(tmp_path, BUILTIN_NAMES)
    message = str(caught.value)
    assert "Bad-Name.json" in message
    assert "name: String should match pattern" in message
    assert "description: Field required" in message


def test_unknown_builtin_is_refused(tmp_path: Path) -> None:
    write_tool(tmp_path, "magic", run={"kind": "builtin", "handler": "magic"})
    with pytest.raises(CatalogueError, match=r"magic\.json: unknown builtin handler 'magic'"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_argv_placeholder_must_be_required_or_defaulted(tmp_path: Path) -> None:
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}}
    run = {"kind": "command", "argv": ["ls", "{path}"]}
    write_tool(tmp_path, "lister", parameters=parameters, run=run)
    with pytest.raises(CatalogueError, match=r"lister\.json: argv placeholder \{path\}"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_program_cannot_be_a_placeholder(tmp_path: Path) -> None:
    parameters = {"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]}
    write_tool(tmp_path, "anyprog", parameters=parameters, run={"kind": "command", "argv": ["{p}"]})
    with pytest.raises(CatalogueError, match=r"argv\[0\] must be a fixed program"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match="folder does not exist"):
        load_catalogue(tmp_path / "absent", BUILTIN_NAMES)


def test_shared_object_schema_is_valid() -> None:
    spec = parse_tool(
        "ok.json",
        '{"name": "ok", "description": "d", "parameters": '
        + str(OBJECT_SCHEMA).replace("'", '"').replace("False", "false")
        + ', "run": {"kind": "builtin", "handler": "clock_now"}}',
        "json",
        BUILTIN_NAMES,
    )
    assert spec.name == "ok"


def test_confine_paths_must_be_absolute_and_normal(tmp_path: Path) -> None:
    run = {"kind": "command", "argv": ["ls"]}
    write_tool(tmp_path, "peek", run=run, confine={"read_only": ["/srv/../etc"]})
    with pytest.raises(CatalogueError, match=r"peek\.json: confine path '/srv/\.\./etc'"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_confine_path_arguments_must_be_string_parameters(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    run = {"kind": "command", "argv": ["ls", "{n}"]}
    write_tool(tmp_path, "peek", parameters=schema, run=run, confine={"path_arguments": ["n"]})
    with pytest.raises(CatalogueError, match="must be a string parameter"):
        load_catalogue(tmp_path, BUILTIN_NAMES)


def test_confine_is_for_command_tools_only(tmp_path: Path) -> None:
    write_tool(tmp_path, "clock", confine={"network": True})
    with pytest.raises(CatalogueError, match="confine applies to command tools only"):
        load_catalogue(tmp_path, BUILTIN_NAMES)
