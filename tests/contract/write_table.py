"""Write docs/contract.md's table from a contract run's measurements.

    LOOPDTEST_CONTRACT_RESULTS=contract.json .venv/bin/pytest tests/contract -q
    .venv/bin/python -m tests.contract.write_table contract.json docs/contract.md

The table sits between two marker lines in the document; everything else there is left alone.
A finding the run did not measure reads "not run", so a partial run cannot pass for a full one.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START = "<!-- contract-table:start -->"
END = "<!-- contract-table:end -->"


@dataclass(frozen=True)
class Finding:
    key: str  # the key the tests record under
    label: str
    relies: str  # what loopd builds on it
    fake: str = ""  # why the fake does not run it ("" when it does)


FINDINGS = (
    Finding(
        "b",
        "(b) cache reuse, 3 turns with tools",
        "Replaying every message byte for byte keeps each request's cost to its new tokens.",
    ),
    Finding(
        "c",
        "(c) tool-call types survive",
        "Arguments are stored as the streamed string and parsed once, by brokerd.",
    ),
    Finding(
        "c-render",
        "(c) tool turns through /apply-template",
        "A replayed call and its result render unescaped, above them the fixed tools.",
    ),
    Finding(
        "d-pin",
        "(d) two sessions, two slots",
        "Slots of their own keep a pinned session's cache; production's unified pool does not, "
        "so loopd does not pin (docs/production-shape.md).",
    ),
    Finding(
        "d-evict",
        "(d) eviction and the host prompt cache",
        "A session pushed out comes back from the host cache; a pinned one only on its own "
        "slot, an unpinned one wherever the server places it.",
    ),
    Finding(
        "d-unified",
        "(d) unified pool, default flags: another slot runs between two requests",
        "On the unified pool loopd does not pin: the server's own placement restores a session "
        "from the host cache (docs/production-shape.md).",
        fake="no unified pool in the fake",
    ),
    Finding(
        "d-unified-keep",
        "(d) unified pool with --no-cache-idle-slots",
        "With this flag a pinned slot keeps its prompt, as on slots of their own.",
        fake="no unified pool in the fake",
    ),
    Finding(
        "d-unified-one-slot",
        "(d) unified pool, default flags: two sessions pinned to one slot",
        "Sessions sharing a slot come back from the host cache.",
        fake="no unified pool in the fake",
    ),
    Finding(
        "d-unload",
        "(d) --models-max 1 unload",
        "A cold cache is a normal event, never an error.",
    ),
    Finding(
        "e",
        "(e) thinking and the cache",
        "reasoning_content is replayed unchanged; the system text and tools never change.",
    ),
    Finding(
        "h",
        "(h) tools fixed per epoch",
        "The tools array is fixed per epoch; other tools come through find_tool/call_tool.",
    ),
    Finding(
        "i",
        "(i) progress during prefill",
        "Every request sets return_progress, so the silence limit holds during prefill.",
    ),
    Finding(
        "j",
        "(j) queued request gets nothing",
        "A separate first-byte limit, with /slots polled to tell queued from dead.",
    ),
    Finding(
        "k",
        "(k) reasoning control call",
        "The thinking cap ends reasoning with the control call and keeps the turn.",
    ),
    Finding(
        "l",
        "(l) closing frees the slot",
        "Hanging up is how loopd cancels a turn.",
    ),
    Finding(
        "m",
        "(m) per-token predicted_n",
        "The thinking cap counts tokens from timings_per_token.",
    ),
    Finding(
        "n",
        "(n) arguments stream as fragments",
        "Tool-call deltas are life for the silence limit; fragments are only joined.",
    ),
)


class TableError(Exception):
    """The results file or the document cannot be used; the message says which and why."""


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(results: dict[str, Any]) -> str:
    rows = [
        "| Finding | Test | Real server (SmolLM2) | Hybrid server (qwen35moe, unified pool) "
        "| Fake | What loopd relies on |",
        "|---|---|---|---|---|---|",
    ]
    for finding in FINDINGS:
        by_kind = results.get(finding.key, {})
        tests = sorted({entry["test"] for entry in by_kind.values()})
        real = by_kind.get("real", {}).get("summary", "not run")
        hybrid = by_kind.get("hybrid", {}).get("summary", "not run")
        fake = finding.fake or by_kind.get("fake", {}).get("summary", "not run")
        names = ", ".join(f"`{name}`" for name in tests) or "not run"
        rows.append(
            f"| {cell(finding.label)} | {names} | {cell(real)} | {cell(hybrid)} | {cell(fake)} "
            f"| {cell(finding.relies)} |"
        )
    return "\n".join(rows)


def splice(document: str, new_table: str) -> str:
    if START not in document or END not in document:
        raise TableError(f"the document has no {START} ... {END} markers")
    head, rest = document.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{new_table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.contract.write_table")
    parser.add_argument("results", type=Path, help="the JSON a contract run wrote")
    parser.add_argument("document", type=Path, help="the Markdown file holding the table")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        document = args.document.read_text()
        args.document.write_text(splice(document, table(results)))
    except (OSError, ValueError, TableError) as exc:
        print(f"write_table: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
