"""The request fields llama-server's chat route reads, from the provisioned build's own source.

``scripts/provision.sh`` keeps the server's sources (``tools/server/``) beside the binary. A
chat request is read in four places, and each reads fields of the request by name:

- the router (``server-models.cpp``, ``proxy_post``) picks the model by ``model``;
- ``oaicompat_chat_params_parse`` (``server-common.cpp``) reads the OpenAI-style fields, renders
  the conversation into a prompt, and copies every other field of the body along;
- ``handle_completions_impl`` (``server-context.cpp``) reads ``prompt``, ``id_slot``, ...;
- ``make_llama_cmpl_schema`` (``server-schema.cpp``) is the table of the completion's fields:
  each ``add((new field_...("name")`` with its ``add_alias("other")``, and what their handlers
  read of the request.

Comments and ``#if 0`` blocks are left out first (the schema keeps disabled fields in both).
"""

import re
from pathlib import Path
from typing import Final

# (file, the text that starts the function or lambda, the names of the request object in it)
READERS: Final = (
    ("server-models.cpp", "this->proxy_post = [", ("body",)),
    ("server-common.cpp", "json oaicompat_chat_params_parse(", ("body",)),
    ("server-context.cpp", "server_routes::handle_completions_impl(", ("data",)),
    ("server-schema.cpp", "make_llama_cmpl_schema(const", ("data",)),
)
SCHEMA_FIELD: Final = re.compile(r'\badd\(\(new field_\w+(?:<[^>]*>)?\(\s*"([^"]+)"')
ALIAS: Final = re.compile(r'\badd_alias\(\s*"([^"]+)"\s*\)')


def reads_of(objects: tuple[str, ...]) -> list[re.Pattern[str]]:
    """The ways C++ code reads a named field of one of ``objects`` (nlohmann::json)."""
    names = "|".join(objects)
    return [
        re.compile(rf'\bjson_value\(\s*(?:{names})\s*,\s*"([^"]+)"'),
        re.compile(rf'\b(?:{names})\s*\.\s*(?:contains|at|find|value|count)\(\s*"([^"]+)"'),
        re.compile(rf'\b(?:{names})\s*\[\s*"([^"]+)"\s*\]'),
    ]


def without_comments(source: str) -> str:
    """``source`` with comments blanked (string and character literals kept as they are) and
    the lines of ``#if 0`` blocks removed."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        two = source[i : i + 2]
        if two == "//":
            end = source.find("\n", i)
            i = n if end < 0 else end
        elif two == "/*":
            end = source.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        elif source[i] in "\"'":
            quote, j = source[i], i + 1
            while j < n and source[j] != quote:
                j += 2 if source[j] == "\\" else 1
            out.append(source[i : j + 1])
            i = j + 1
        else:
            out.append(source[i])
            i += 1
    kept, depth = [], 0
    for line in "".join(out).splitlines():
        directive = line.strip()
        if depth:
            if directive.startswith("#if"):
                depth += 1
            elif directive.startswith("#endif"):
                depth -= 1
            continue
        if re.fullmatch(r"#\s*if\s+0\b.*", directive):
            depth = 1
            continue
        kept.append(line)
    return "\n".join(kept)


def _blank_literals(code: str) -> str:
    """``code`` with the inside of every string and character literal blanked, so that braces
    in them do not count."""
    return re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', lambda m: " " * len(m[0]), code)


def body_of(code: str, start: str) -> str:
    """The braced body of the function or lambda whose text begins with ``start``."""
    at = code.index(start)
    blank = _blank_literals(code)
    opening = blank.index("{", at)
    depth = 0
    for i in range(opening, len(blank)):
        if blank[i] == "{":
            depth += 1
        elif blank[i] == "}":
            depth -= 1
            if depth == 0:
                return code[opening : i + 1]
    raise ValueError(f"no end to the body of {start!r}")


def chat_request_fields(server_dir: Path) -> frozenset[str]:
    """Every top-level field of a chat request that the server at ``server_dir/tools/server``
    reads (``ValueError`` when a reader is not where this module looks)."""
    fields: set[str] = set()
    for file_name, start, objects in READERS:
        code = without_comments((server_dir / "tools" / "server" / file_name).read_text())
        body = body_of(code, start)
        for pattern in reads_of(objects):
            fields.update(pattern.findall(body))
        if file_name == "server-schema.cpp":
            for statement in body.split("add((new ")[1:]:
                fields.update(SCHEMA_FIELD.findall("add((new " + statement))
                # Aliases of the field itself (a nested field's subfields come after its own).
                fields.update(ALIAS.findall(statement.split("add_subfield")[0]))
    return frozenset(fields)
