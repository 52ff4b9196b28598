"""The edges of ``make bench``, in one run: a command's start-up (``bench.startup``), brokerd's
relay of a streamed answer (``bench.relay``) and the wait a person saw, recorded in parts
(``bench.queuewait``).

``python -m bench.edges`` prints the three sections beside a recorded earlier run (``--before``,
default ``bench/results/edges-before.json``), and can record its own (``--save``). ``--tree DIR``
measures another checkout's loopd and brokerd (its folder first on ``PYTHONPATH``; the bench is
this one): how the recorded "before" run was made, on the tree before these sections' changes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench import queuewait, relay, scale, startup
from loopd_dev import devserver

RESULTS: Final = Path(__file__).resolve().parent / "results"
BEFORE: Final = RESULTS / "edges-before.json"
COMMAND: Final = "python -m bench.edges"


def measure(
    cache_dir: Path,
    repeats: int,
    tree: Path | None = None,
    command: str = COMMAND,
    relay_before: Path | None = None,
) -> dict[str, Any]:
    """``relay_before``: a checkout whose brokerd the relay section measures in the same run."""
    with tempfile.TemporaryDirectory(prefix="be") as tmp:
        work = Path(tmp)
        (work / "startup").mkdir()
        (work / "relay").mkdir()
        return {
            "command": command,
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "load": os.getloadavg()[0],
            "tree": str(tree) if tree else "",
            "startup": startup.measure(work / "startup", cache_dir, repeats, tree),
            "relay": relay.measure(work / "relay", repeats=repeats, tree=tree, beside=relay_before),
            "queue": _queue(work, tree),
        }


def _queue(work: Path, tree: Path | None) -> list[dict[str, Any]]:
    if tree is None:
        return queuewait.measure()
    # This bench, with the other tree's loopd under it: a folder holding only the bench first.
    only = work / "bench-only"
    only.mkdir()
    (only / "bench").symlink_to(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=f"{only}{os.pathsep}{tree}")
    found = subprocess.run(
        [sys.executable, "-m", "bench.queuewait", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=work,
    )
    rows: list[dict[str, Any]] = json.loads(found.stdout)
    return rows


def render(after: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
    lines = [
        "## The edges: start-up, relay, and the wait people see",
        "",
        f"Command: `{after['command']}`, {after['when']}, load average {after['load']:.1f} at "
        "the start."
        + (
            f" Before: `{before['command']}` on the tree before these changes, {before['when']}, "
            f"load average {before['load']:.1f}."
            if before
            else ""
        ),
        "",
    ]
    lines += startup.render(after["startup"], before["startup"] if before else None)
    lines += ["", *relay.render(after["relay"], before["relay"] if before else None)]
    lines += ["", *queuewait.render(after["queue"], before["queue"] if before else None)]
    return lines


def before(path: Path = BEFORE) -> dict[str, Any] | None:
    """The recorded run of the tree before these sections' changes, if there is one."""
    return scale.before(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each measurement")
    parser.add_argument("--tree", type=Path, help="measure another checkout's loopd and brokerd")
    parser.add_argument(
        "--relay-before",
        type=Path,
        help="measure this checkout's brokerd too, in the same run (the tree before a change)",
    )
    parser.add_argument("--before", type=Path, default=BEFORE, help="an earlier run to show beside")
    parser.add_argument("--save", type=Path, help="record this run here (JSON)")
    parser.add_argument("--cache-dir", type=Path, default=devserver.default_cache_dir())
    args = parser.parse_args(argv)
    given = " ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)])
    found = measure(args.cache_dir, args.repeats, args.tree, given, args.relay_before)
    if args.save:
        args.save.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    print("\n".join(render(found, before(args.before))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
