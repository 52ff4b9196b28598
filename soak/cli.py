"""``python -m soak`` (``make soak``): the load-and-chaos run; exit 1 when an invariant broke.

``SOAK_S`` (default 600) is the length of the load, ``SOAK_SEED`` repeats a plan,
``SOAK_THREADS`` (default 40) the number of threads, ``SOAK_DURABLE`` (default ``both``) runs
the plan with loopd's durable sessions on, off, or on and then off, side by side in one report.
The report goes to ``docs/soak.md`` with its plot beside it (``--doc`` elsewhere). The last line
printed gives the figures.

The run needs a private mount namespace for loopd's small state file system (the disk-full
fault): it enters one first (``unshare``), as root or in a user namespace.

Ctrl-C (SIGINT) or SIGTERM stops the run: every process it started is ended, the work folder is
kept, no report is written, and the exit status is 128 plus the signal's number.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from signal import Signals

import anyio

from loopcommon.stopsignals import StopSignals
from soak.plan import Plan, make_plan
from soak.report import Figures, comparison_line, latency_plot, render, verdict
from soak.run import Options, SoakInterrupted, run_soak
from soak.stack import SoakError
from soak.users import Pace

NAMESPACE_MARK = "SOAK_IN_NAMESPACE"
DOC = Path(__file__).resolve().parents[1] / "docs" / "soak.md"
EXIT_FAILED = 1
EXIT_SETUP = 2
# The server's save folder. A run of 40 threads keeps states of about 350 tokens on average
# (23 KB a token on SmolLM2: 8 MiB), so every thread's latest state takes some 320 MiB, while
# its 150 turns write over 1 GiB of saves: the cap is at work all along and still keeps each
# thread's latest state. At 128 MiB (14 states) it removed most threads' latest state before
# they came back: 58 of the 60 restores loopd asked for found their file removed.
SAVE_CAP_MIB = 512
DURABLE_RUNS = {"on": (True,), "off": (False,), "both": (True, False)}


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        pair = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or N-M") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: want 1 <= N <= M")
    return pair


def _calls(text: str) -> tuple[int, int]:
    pair = _range(text)
    if pair[1] > 20:
        raise argparse.ArgumentTypeError("at most 20 tool calls per message")
    return pair


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_S", "600")))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("SOAK_THREADS", "40")))
    parser.add_argument(
        "--seed", type=int, default=int(os.environ.get("SOAK_SEED", random.randrange(1 << 31)))
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the report (a PNG goes beside it)")
    parser.add_argument("--calls", type=_calls, default=(1, 4), help="tool calls per tool message")
    parser.add_argument("--think", type=float, default=60.0, help="mean pause between messages")
    parser.add_argument(
        "--patience",
        type=_range,
        default=(180, 360),
        help="seconds a user waits for an answer before posting again (N-M)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds the run waits, after the load, for every turn to end (default: 0.8 times "
        "--seconds, at least 480: the load's backlog on two slots of a shared machine takes "
        "minutes to clear, and a 600 s run, its stop and its checks still end within 20 minutes)",
    )
    parser.add_argument("--min-tool-calls", type=int, default=50)
    parser.add_argument(
        "--durable",
        choices=sorted(DURABLE_RUNS),
        default=os.environ.get("SOAK_DURABLE", "both"),
        help="loopd's durable sessions in the run: on, off, or both (the plan twice, on then "
        "off, set side by side)",
    )
    parser.add_argument(
        "--save-cap-mib",
        type=int,
        default=SAVE_CAP_MIB,
        help="brokerd's cap (slot_save_max_bytes) over the server's save folder, MiB",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    if args.seconds < 30 or args.threads < 1:
        parser.error("--seconds must be at least 30 and --threads at least 1")
    if args.settle is not None and args.settle < 30:
        parser.error("--settle must be at least 30")
    if args.durable not in DURABLE_RUNS:
        parser.error(f"--durable (SOAK_DURABLE) is one of {', '.join(sorted(DURABLE_RUNS))}")
    if args.save_cap_mib < 1:
        parser.error("--save-cap-mib must be at least 1")
    return args


def enter_namespace(argv: list[str]) -> None:
    """Run again inside a private mount namespace (replacing this process)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        sys.exit("soak: `unshare` (util-linux) is needed for the run's private state file system")
    env = {**os.environ, NAMESPACE_MARK: "1"}
    options = ["--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        options = ["--user", "--map-root-user", *options]
    os.execve(unshare, [unshare, *options, sys.executable, "-m", "soak", *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if os.environ.get(NAMESPACE_MARK) != "1":
        enter_namespace(argv)
    logging.basicConfig(
        level=logging.WARNING, format="soak: %(name)s: %(message)s", stream=sys.stderr
    )
    command = os.environ.get("SOAK_COMMAND") or shlex.join(["python", "-m", "soak", *argv])
    plan = make_plan(args.seed, args.seconds, args.threads)
    runs: list[tuple[Figures, Path]] = []
    with StopSignals() as signals:
        for durable in DURABLE_RUNS[args.durable]:
            done = _one_run(args, plan, command, durable, signals)
            if isinstance(done, int):
                return done
            runs.append(done)
        if (late := signals.received()) is not None:  # after the last run's stack was down
            return _interrupted(late, [workdir for _, workdir in runs])
    figures, without = runs[0][0], (runs[1][0] if len(runs) > 1 else None)
    plot = args.doc.with_suffix(".png")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    latency_plot(figures, plot)
    args.doc.write_text(render(figures, plot.name, without))
    failures = verdict(figures, without)
    for line in failures:
        print(f"soak: {line}")
    for run_figures, run_dir in runs:
        if run_figures.failures() or args.keep:
            print(f"soak: logs and state in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(f"soak: report: {args.doc}")
    for run_figures, _ in runs:
        print(run_figures.last_line())
    if without is not None:
        print(comparison_line(figures, without))
    sys.stdout.flush()
    return EXIT_FAILED if failures else 0


def _one_run(
    args: argparse.Namespace, plan: Plan, command: str, durable: bool, signals: StopSignals
) -> tuple[Figures, Path] | int:
    """One run of ``plan``, in a work folder of its own; the exit status when it could not run."""
    workdir = Path(tempfile.mkdtemp(prefix="soak", dir="/tmp"))
    options = Options(
        seconds=args.seconds,
        threads=args.threads,
        seed=args.seed,
        workdir=workdir,
        pace=Pace(think_s=args.think, patience_s=args.patience, calls=args.calls),
        min_tool_calls=args.min_tool_calls,
        command=command,
        settle_s=args.settle if args.settle is not None else max(480.0, args.seconds * 0.8),
        durable=durable,
        save_cap_bytes=args.save_cap_mib << 20,
    )
    try:
        figures = anyio.run(run_soak, options, plan, signals)
    except SoakInterrupted as exc:
        return _interrupted(exc.signal, [workdir])
    except SoakError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        print(f"soak: the work folder is kept: {workdir}", file=sys.stderr)
        return EXIT_SETUP
    print(figures.last_line(), flush=True)
    return figures, workdir


def _interrupted(signal: Signals, workdirs: list[Path]) -> int:
    print(f"soak: stopped by {signal.name}; every process the run started has ended", flush=True)
    for workdir in workdirs:
        print(f"soak: the work folder is kept: {workdir}", flush=True)
    return 128 + signal.value
