"""loopcommon.schemas: tool schemas checked and applied with their patterns on RE2."""

from typing import Any

import jsonschema
import pytest

from loopcommon.schemas import check_schema, validator


def messages(schema: dict[str, Any], value: Any) -> list[str]:
    return [error.message for error in validator(schema).iter_errors(value)]


def test_an_ecma_unicode_escape_is_understood() -> None:
    schema = {"type": "string", "pattern": "^/[^\\u0000]*$"}
    check_schema(schema)
    assert messages(schema, "/a/b") == []
    assert messages(schema, "/a\x00") == ["'/a\\x00' does not match '^/[^\\\\u0000]*$'"]


def test_pattern_properties_and_additional_properties_match_on_re2() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x-[a-z]+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert messages(schema, {"x-a": 1}) == []
    assert messages(schema, {"x-a": "one"}) == ["'one' is not of type 'integer'"]
    assert messages(schema, {"y": 1}) == ["'y' do not match any of the regexes: '^x-[a-z]+$'"]


def test_the_draft_of_the_schema_is_kept() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    check_schema(schema)
    assert messages(schema, [1]) == ["1 is not of type 'string'"]


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"properties": {"a": {"pattern": "(a)\\1"}}}, ["properties", "a", "pattern"]),
        ({"patternProperties": {"(?!x)": {}}}, ["patternProperties", "(?!x)"]),
        ({"unevaluatedProperties": False, "patternProperties": {"a": {}}}, []),
    ],
)
def test_what_cannot_run_in_linear_time_is_refused_with_its_place(
    schema: dict[str, Any], where: list[str]
) -> None:
    with pytest.raises(jsonschema.SchemaError) as raised:
        check_schema(schema)
    assert list(raised.value.path) == where


def test_a_pattern_in_data_is_not_a_regex() -> None:
    check_schema({"type": "object", "default": {"pattern": "(a)\\1"}})
