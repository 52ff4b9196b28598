"""Checking values against a tool's JSON Schema, for every schema loopd and brokerd use (loopd's
tools file, brokerd's catalogue, MCP servers' input schemas): one factory, ``validator``.

jsonschema matches ``pattern``, ``patternProperties`` and ``additionalProperties`` with Python's
backtracking ``re``, synchronously: a schema pattern such as ``^([a-z0-9]+-?)*$`` and a short
argument can hold the event loop for seconds, doubling with each character. Here those keywords
match with RE2 (``loopcommon.linearregex``), in time linear in the argument, and ``check_schema``
refuses, when the schema is loaded, a pattern RE2 cannot compile (backreferences, lookaround)
and ``unevaluatedProperties`` beside ``patternProperties`` (jsonschema matches that pair with
``re`` again). ``format`` is never asserted (no format checker is given), so ``format: regex``
runs nothing.
"""

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import jsonschema
from jsonschema import ValidationError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import extend, validator_for

from loopcommon.linearregex import RegexError, compile_linear

# Keywords whose values are data, not schemas: a "pattern" inside them is not a regex.
_DATA_KEYWORDS: Final = frozenset({"const", "enum", "default", "examples"})


def check_schema(schema: dict[str, Any]) -> None:
    """``jsonschema.SchemaError`` when ``schema`` is not a valid JSON Schema under its own
    ``$schema`` (default 2020-12), or has a pattern that cannot run in linear time."""
    validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    for path, pattern in _patterns(schema):
        try:
            _compile(pattern)
        except RegexError as exc:
            raise jsonschema.SchemaError(
                f"the pattern {pattern[:200]!r} cannot run in linear time (RE2: {exc})", path=path
            ) from None
    for path, node in _schemas(schema):
        if "unevaluatedProperties" in node and "patternProperties" in node:
            raise jsonschema.SchemaError(
                "unevaluatedProperties beside patternProperties is not supported (its patterns "
                "would not run in linear time)",
                path=path,
            )


def validator(schema: Mapping[str, Any]) -> Validator:
    """A validator for ``schema`` (its own ``$schema`` decides the draft) matching on RE2."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    return _linear(cls)(schema)


def first_error(schema: Mapping[str, Any], value: Any) -> ValidationError | None:
    """The error that best explains why ``value`` breaks ``schema`` (jsonschema's
    ``best_match``), or None when it holds."""
    error: ValidationError | None = best_match(validator(schema).iter_errors(value))
    return error


@functools.cache
def _linear(cls: type[Validator]) -> type[Validator]:
    extended: type[Validator] = extend(  # type: ignore[no-untyped-call]
        cls,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": functools.partial(
                _additional_properties, cls.VALIDATORS["additionalProperties"]
            ),
        },
    )
    return extended


# The keywords' functions are called by jsonschema with its validator (which has ``descend``,
# not part of its protocol) and any JSON value.
def _search(pattern: str, text: str) -> bool:
    try:
        return _compile(pattern).search(text) is not None
    except RegexError:
        return False  # refused when the schema was loaded; a schema checked nowhere matches none


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, str(instance)):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    plain: Callable[..., Iterator[ValidationError]],
    validator: Any,
    allowed: Any,
    instance: Any,
    schema: Mapping[str, Any],
) -> Iterator[ValidationError]:
    if "patternProperties" not in schema:  # no pattern to match: jsonschema's own, as worded
        yield from plain(validator, allowed, instance, schema)
        return
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        shown = ", ".join(repr(extra) for extra in sorted(extras))
        listed = ", ".join(repr(pattern) for pattern in sorted(patterns))
        yield ValidationError(f"{shown} do not match any of the regexes: {listed}")


def _compile(pattern: str) -> Any:
    return compile_linear(_re2_syntax(pattern))


def _re2_syntax(pattern: str) -> str:
    """A schema's pattern (ECMA-262 syntax) in RE2's: ``\\uXXXX`` is written ``\\x{XXXX}``."""
    out: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and pattern[index + 1 : index + 2] == "u":
            digits = pattern[index + 2 : index + 6]
            if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
                out.append(f"\\x{{{digits}}}")
                index += 6
                continue
        if char == "\\":  # an escape: its next character is taken as it is
            out.append(pattern[index : index + 2])
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _schemas(schema: Mapping[str, Any]) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every object in ``schema`` outside data keywords, with its path (no recursion)."""
    stack: list[tuple[tuple[str | int, ...], object]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            yield path, node
            stack.extend(
                ((*path, key), value) for key, value in node.items() if key not in _DATA_KEYWORDS
            )
        elif isinstance(node, list):
            stack.extend(((*path, index), value) for index, value in enumerate(node))


def _patterns(schema: Mapping[str, Any]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    for path, node in _schemas(schema):
        if isinstance(node.get("pattern"), str):
            yield (*path, "pattern"), node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            for pattern in node["patternProperties"]:
                yield (*path, "patternProperties", pattern), pattern
