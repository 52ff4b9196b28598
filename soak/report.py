"""The run's figures, its verdict, its last line, and docs/soak.md with the latency plot."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from matplotlib.figure import Figure

from bench.machine import Machine
from loopd.engine.durable import RESTORE_GAIN_TOKENS
from soak.chaos import Injected
from soak.checks import Latency, SlotWait, percentile
from soak.durability import Folder, Returns, Reuse
from soak.plan import SERVER_KILLS, FaultKind
from soak.procs import Exit


@dataclass(frozen=True)
class Memory:
    start_kib: int | None
    end_kib: int | None
    peak_kib: int | None


@dataclass(frozen=True)
class Cpu:
    own_s: float  # the run itself: users, chaos, relay, checks
    children_s: float  # the stack: llama-server, brokerd, loopd, the fake (all waited for)
    capacity_s: float  # wall time times cores

    @property
    def others_share(self) -> float:
        """The share of the machine the run did not use (other work on it, or idle)."""
        used = self.own_s + self.children_s
        return max(0.0, 1.0 - used / self.capacity_s) if self.capacity_s else 0.0


@dataclass
class Figures:
    command: str
    seed: int
    seconds: float
    threads: int
    machine: Machine
    load_before: str
    load_after: str
    messages: int = 0
    stop_posts: int = 0
    edits: int = 0
    edits_acknowledged: int = 0
    reactions: int = 0
    lost: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    answered_twice: list[str] = field(default_factory=list)
    stored_twice: list[str] = field(default_factory=list)
    error_then_answered: int = 0
    answers: int = 0
    stops: int = 0
    errors: int = 0
    notices: int = 0
    tool_calls: int = 0
    tools_started: int = 0
    tools_twice: list[str] = field(default_factory=list)
    scripted_rounds: int = 0
    compactions: int = 0
    verify: str = ""
    verify_ok: bool = False
    faults: list[Injected] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    start_limit_hits: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    fds: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    fd_leaks: list[str] = field(default_factory=list)
    memory: Memory = Memory(None, None, None)
    cpu: Cpu = Cpu(0.0, 0.0, 0.0)
    latencies: list[Latency] = field(default_factory=list)
    slots: list[SlotWait] = field(default_factory=list)
    drained: bool = False
    settle_s: tuple[float, float] = (0.0, 0.0)  # the wait for every turn to end, and its limit
    load_start: float = 0.0
    disk_full_seen: int = 0
    min_tool_calls: int = 50
    # Durable sessions: on for this run (LOOPD_DURABLE), what loopd said it ran with, the
    # returns after server kills, every request's reuse, and the server's save folder.
    durable: bool = False
    durable_said: str = ""
    returns: Returns = field(default_factory=Returns)
    reuse: Reuse = field(default_factory=Reuse)
    folder_samples: list[tuple[float, int]] = field(default_factory=list)
    folder: Folder | None = None

    @property
    def turns(self) -> int:
        return self.answers + self.stops + self.errors

    def failures(self) -> list[str]:
        """Each broken invariant, one line each; empty when the run passed."""
        out = [f"message lost: {m}" for m in self.lost]
        out += [f"answered twice: {m}" for m in self.answered_twice]
        out += [f"stored twice: {m}" for m in self.stored_twice]
        out += [f"tool ran twice: {t}" for t in self.tools_twice]
        if self.tools_started < self.tool_calls:
            out.append(
                f"the marks file shows {self.tool_calls} tool runs, brokerd's audit log only "
                f"{self.tools_started} started"
            )
        if not self.verify_ok:
            out.append(f"loopd log verify failed: {self.verify}")
        fired = {f.kind for f in self.faults if f.fired}
        out += [f"fault kind never fired: {kind}" for kind in FaultKind if kind not in fired]
        if self.tool_calls < self.min_tool_calls:
            out.append(f"only {self.tool_calls} tool calls ran (at least {self.min_tool_calls})")
        out += [f"start limit hit (crash loop): {hit}" for hit in self.start_limit_hits]
        out += [
            f"{e.name} crashed (pid {e.pid}, {e.how}): {_last_line(e.said)}"
            for e in self.exits
            if e.crashed
        ]
        out += [f"process leaked: {p}" for p in self.leaked]
        out += [f"file descriptors leaked: {f}" for f in self.fd_leaks]
        if not self.drained:
            out.append(
                f"the system did not settle after the load: {len(self.pending)} message(s) still "
                "waited for their turn when the run stopped waiting"
            )
        return out + self._durable_failures()

    def _durable_failures(self) -> list[str]:
        out = []
        word = "on" if self.durable else "off"
        if self.durable_said and not self.durable_said.startswith(f"durable sessions: {word}"):
            out.append(f"durable sessions were to be {word}; loopd said: {self.durable_said}")
        if self.durable and not self.durable_said:
            out.append("loopd never said it ran with durable sessions on")
        if self.durable and self.returns.worth_restoring and not self.returns.restored:
            out.append(
                f"durable sessions on, and none of the {self.returns.worth_restoring} returns "
                "after a server kill that had lost enough to restore was restored from disk"
            )
        folder = self.folder
        if self.durable and folder is not None and folder.end_bytes > folder.cap_bytes:
            out.append(
                f"the save folder holds {folder.end_bytes:,} bytes at the end, over its cap of "
                f"{folder.cap_bytes:,}"
            )
        return out

    def last_line(self) -> str:
        verdict = "FAIL" if self.failures() else "PASS"
        return (
            f"soak {verdict}: messages lost {len(self.lost)}, answered twice "
            f"{len(self.answered_twice)}, tools run twice {len(self.tools_twice)}, turns "
            f"{self.turns}, faults injected {sum(f.fired for f in self.faults)} "
            f"(seed {self.seed}, {self.seconds:.0f} s, {self.threads} threads, "
            f"{self.tool_calls} tool calls); {self.returns_phrase()}"
        )

    def returns_phrase(self) -> str:
        r = self.returns
        return (
            f"durable sessions {'on' if self.durable else 'off'}: {r.returns} returns after "
            f"{r.kills} server kills, {r.worth_restoring} worth restoring, {r.restored} restored "
            f"from disk, re-read {r.reread} prompt tokens (ideal {r.ideal})"
        )


def verdict(figures: Figures, without: Figures | None = None) -> list[str]:
    """Every broken invariant of the run and of the run without durable sessions beside it."""
    out = figures.failures()
    if without is not None:
        out += [f"the run with durable sessions off: {line}" for line in without.failures()]
    return out


def comparison_line(on: Figures, off: Figures) -> str:
    """The last line of a run with durable sessions and one without, on the same plan."""
    word = "FAIL" if verdict(on, off) else "PASS"
    a, b = on.returns, off.returns
    return (
        f"soak {word} (durable sessions on and off, seed {on.seed}): messages lost "
        f"{len(on.lost)} and {len(off.lost)}, answered twice {len(on.answered_twice)} and "
        f"{len(off.answered_twice)}; returns after a server kill re-read {a.reread} of "
        f"{a.prompt} prompt tokens with durable sessions (ideal {a.ideal}, {a.restored} of "
        f"{a.returns} restored from disk), {b.reread} of {b.prompt} without (ideal {b.ideal})"
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else ""


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f} MiB"


def latency_rows(latencies: list[Latency]) -> list[str]:
    rows = []
    for label, group in (
        ("all turns", latencies),
        ("with a fault", [lat for lat in latencies if lat.with_fault]),
        ("without faults", [lat for lat in latencies if not lat.with_fault]),
    ):
        values = [lat.seconds for lat in group]
        rows.append(
            f"| {label} | {len(values)} | {_seconds(percentile(values, 0.5))} | "
            f"{_seconds(percentile(values, 0.95))} | {_seconds(percentile(values, 0.99))} |"
        )
    return rows


def render(figures: Figures, plot_name: str, without: Figures | None = None) -> str:
    """The report of ``figures``' run; ``without``: the same plan's run with durable sessions
    off, set beside it."""
    f = figures
    failures = verdict(figures, without)
    machine = f.machine
    fired = Counter(x.kind for x in f.faults if x.fired)
    armed = Counter(x.kind for x in f.faults)
    lines = [
        "# Soak: load and chaos",
        "",
        f"Generated by the run itself (`soak/`), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Do not "
        "edit: run it again.",
        "",
        f"- Command: `{f.command}`",
        f"- Seed: `{f.seed}` (the command above with `SOAK_SEED={f.seed}` in front repeats the "
        "same plan; the processes' timing still differs run to run)",
        f"- Machine: {machine.cpu_model}, {machine.cores} cores, {machine.memory_gib:.1f} GiB, "
        f"{machine.system}, Python {machine.python}",
        f"- Load average (1/5/15 min) before: {f.load_before}; after: {f.load_after}. The "
        "machine is shared: other work on it slows every turn measured here.",
        f"- Load phase {f.seconds:.0f} s, {f.threads} threads; then the run waits for every "
        f"turn to end (at most {f.settle_s[1]:.0f} s): "
        + (f"settled in {f.settle_s[0]:.0f} s." if f.drained else "did NOT settle."),
        "",
        f"**Result: {'FAIL' if failures else 'PASS'}**",
        "",
    ]
    if failures:
        lines += [f"- {line}" for line in failures[:50]] + [""]
    lines += [
        "## Figures",
        "",
        "| Figure | Value |",
        "|---|---|",
        f"| user messages posted | {f.messages} (plus {f.stop_posts} stop replies, "
        f"{f.reactions} stop reactions, {f.edits} edits) |",
        f"| **messages lost** | **{len(f.lost)}** |",
        f"| messages still waiting when the run stopped (it did not settle) | {len(f.pending)} |",
        f"| **answered twice** | **{len(f.answered_twice)}** |",
        f"| stored twice | {len(f.stored_twice)} |",
        f"| **tools run twice** | **{len(f.tools_twice)}** |",
        f"| tool calls run (brokerd, `mark_ticket`) | {f.tool_calls} (audit log: "
        f"{f.tools_started} started; at least {f.min_tool_calls} required) |",
        f"| tool rounds scripted by the relay | {f.scripted_rounds} |",
        f"| turns | {f.turns}: {f.answers} answers, {f.stops} stopped, {f.errors} error posts |",
        f"| messages with an error post, answered later | {f.error_then_answered} |",
        f"| notices (queue full, edits, stops with nothing running) | {f.notices} |",
        f"| edits acknowledged with a notice | {f.edits_acknowledged} |",
        f"| compactions | {f.compactions} |",
        f"| `loopd log verify` | {f.verify} |",
        f"| faults injected (fired / planned) | {sum(fired.values())} / {sum(armed.values())} |",
        f"| loopd serve exits | {_starts(f.exits, 'loopd serve')} |",
        f"| brokerd exits | {_starts(f.exits, 'brokerd')} |",
        f"| unexpected exits | {_unexpected(f.exits)} |",
        f"| loopd RSS start / end / peak | {_mib(f.memory.start_kib)} / {_mib(f.memory.end_kib)}"
        f" / {_mib(f.memory.peak_kib)} |",
        *(
            f"| {name} open files, idle at start / at end | {a} / {b} |"
            for name, (a, b) in f.fds.items()
        ),
        f"| processes left after the stop | {len(f.leaked)} |",
        f"| orphans reaped during the run (sandbox processes whose parent exited first) | "
        f"{len(f.orphans)} |",
        f"| disk-full errors loopd logged | {f.disk_full_seen} |",
        f"| CPU: the stack / the run's own (users, chaos, relay) / the machine's capacity | "
        f"{f.cpu.children_s:.0f} s / {f.cpu.own_s:.0f} s / {f.cpu.capacity_s:.0f} s "
        f"({f.cpu.others_share:.0%} left to other work or idle) |",
        "",
        "### Turn latency (first message posted to the reply in the thread)",
        "",
        "A turn counts as *with a fault* when a fault was injected between "
        "15 s before its first message and its reply.",
        "",
        "| Turns | n | p50 | p95 | p99 |",
        "|---|---|---|---|---|",
        *latency_rows(f.latencies),
        "",
        "### Queue fairness per slot (a turn's wait for its slot in loopd's own line)",
        "",
        "| Slot | turns | mean wait | longest wait | longest / mean |",
        "|---|---|---|---|---|",
        *(
            f"| {s.slot} | {len(s.waits)} | {s.mean:.1f} s | {s.longest:.1f} s | "
            f"{(s.longest / s.mean if s.mean else 0):.1f} |"
            for s in f.slots
        ),
        "",
        f"![turn latency over time, faults marked]({plot_name})",
        "",
        *durable_section([f] if without is None else [f, without]),
        "## Faults",
        "",
        "| At | Fault | Fired | What happened |",
        "|---|---|---|---|",
        *(
            f"| {x.at - f.load_start:.0f} s | {x.kind} | {'yes' if x.fired else 'NO'} | "
            f"{x.detail} |"
            for x in f.faults
        ),
        "",
        "## How to run it",
        "",
        "- `make soak`: `SOAK_S` seconds of load (default 600), `SOAK_THREADS` threads (default "
        "40), `SOAK_SEED` to repeat a plan. It needs the real llama-server (`make llama-server`) "
        "and `unshare` (util-linux), writes this file and its plot, prints the figures on its "
        "last line, and exits 1 when an invariant fails (2 when the stack could not start). "
        "`SOAK_DURABLE` (`--durable`) is `both` by default: the plan runs twice, with durable "
        "sessions on and then off, and the report sets the two side by side (`on` or `off` "
        "runs it once). `python -m soak --help` lists the users' pace and the save folder's cap; "
        "`--keep` keeps the logs and state.",
        "- The short version (60 s, 10 threads, durable sessions on, the same invariants, "
        "users quicker and tool "
        "messages asking for more so that a minute holds enough tool calls) is "
        "`tests/soak/test_soak_short.py`, a `real_server` test that `make test` runs: "
        "`.venv/bin/pytest -q tests/soak/test_soak_short.py`.",
        "",
        "## What runs and what is checked",
        "",
        "- The real llama-server (router mode, `smollm2`, two slots of 4096 tokens) behind an "
        "inference relay of the run's own, brokerd with `infer.sock`, `chat.sock` and "
        "`broker.sock` in front of it and of the fake Mattermost (its own process), and "
        "`loopd serve` under a supervisor that restarts it, and brokerd, 1 s after any exit "
        "(systemd's `Restart=always`, `RestartSec=1`). loopd's state directory is a 64 MiB "
        "tmpfs in the run's own mount namespace, which the disk-full fault fills. The router "
        "runs with `--slot-save-path`, brokerd with `slot_save_dirs` and "
        "`slot_save_max_bytes` over that folder, loopd with `LOOPD_DURABLE` on or off.",
        "- Simulated users post in direct messages and channel threads: short questions, long "
        "messages (those sessions compact: `LOOPD_COMPACT_AT=0.2`), and tool requests. The tiny "
        "model never calls a tool by itself, so a tool request carries `[soak-tool TAG xN wW]`, "
        "and the relay (not loopd, not brokerd) answers the turn's requests in the model's place "
        "with `find_tool`, then N `call_tool` calls of `mark_ticket`, which brokerd runs and "
        "which appends its tag to a marks file; every other request, those carrying the tool "
        "results included, reaches the real server. Users also post bursts, stop turns (the "
        "word or the reaction), and edit messages.",
        "- From the outside, at the end: every user message stored once (by post id) and "
        "covered by exactly one reply: the answer of the first turn that ends after it (messages "
        "that came during a turn are answered together by the next one), a stop notice, the "
        "error post of the turn that failed on it, or the notice that refused it; no reply key "
        "posted twice and no answer without a new message; `loopd log verify`; no tool tag run "
        "twice (the marks file) and no more runs than brokerd's audit log started; no process "
        "left after the stop; open files of loopd and brokerd; every fault kind fired; at least "
        f"{f.min_tool_calls} tool calls. With durable sessions on: loopd said so at its "
        "start, at least one return after a server kill was restored from disk (when any "
        "session came back), and the save folder is under its cap at the end.",
        "",
    ]
    if f.exits:
        lines += ["## Process exits", ""]
        lines += [
            f"- {e.ended_at - f.load_start:.0f} s: {e.name} pid {e.pid} ({e.how}, "
            f"{'caused by the run' if e.killed_by_run else 'UNEXPECTED'})"
            + ("" if e.killed_by_run else f": {_last_line(e.said)}")
            for e in sorted(f.exits, key=lambda e: e.ended_at)
        ]
        lines.append("")
    last = [f.last_line()]
    if without is not None:
        last = [f.last_line(), without.last_line(), comparison_line(f, without)]
    lines += ["```", *last, "```", ""]
    return "\n".join(lines)


def _ratio(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _bytes(value: int) -> str:
    return f"{value / (1 << 20):.1f} MiB"


def _folder_cells(folder: Folder | None) -> tuple[str, str, str]:
    if folder is None:
        return ("-", "-", "-")
    return (
        f"{_bytes(folder.peak_bytes)} of {_bytes(folder.cap_bytes)}",
        f"{folder.over_cap} of {len(folder.samples)}",
        f"{_bytes(folder.end_bytes)} in {folder.end_files} files; {folder.evicted_files} "
        "removed by brokerd during the run",
    )


def durable_rows(runs: list[Figures]) -> list[str]:
    """The durable sessions' figures of one run or more, a column each."""

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    def ttfb(r: Returns) -> str:
        median = percentile(list(r.ttfb_ms), 0.5)
        if median is None:
            return "-"
        return f"{median / 1000:.1f} s / {r.ttfb_ms[-1] / 1000:.1f} s"

    returns = [f.returns for f in runs]
    folders = [_folder_cells(f.folder) for f in runs]
    head = [f"durable sessions {'on' if f.durable else 'off'}" for f in runs]
    causes = ["; ".join(f"{cause}: {n}" for cause, n in f.reuse.by_cause) or "-" for f in runs]
    return [
        row("Figure", head),
        "|---|" + "---|" * len(runs),
        row("verdict", [("FAIL" if f.failures() else "PASS") for f in runs]),
        row(
            "messages lost / answered twice / turns",
            [f"{len(f.lost)} / {len(f.answered_twice)} / {f.turns}" for f in runs],
        ),
        row("loopd said", [f.durable_said or "-" for f in runs]),
        row(
            "server kills (the model child, or the whole server and started again)",
            [str(r.kills) for r in returns],
        ),
        row("**returns after a server kill**", [f"**{r.returns}**" for r in returns]),
        row(
            "of them lost enough to restore (loopd's rule: the server kept under half of the "
            f"session, or {RESTORE_GAIN_TOKENS} tokens or more were lost)",
            [str(r.worth_restoring) for r in returns],
        ),
        row("of them restored from disk", [str(r.restored) for r in returns]),
        row("their prompts, tokens", [str(r.prompt) for r in returns]),
        row(
            "**prompt tokens re-read on them** (share of their prompts)",
            [f"**{r.reread}** ({_ratio(r.reread_share, '.0%')})" for r in returns],
        ),
        row("ideal: their new tokens", [str(r.ideal) for r in returns]),
        row("re-read / ideal", [_ratio(r.over_ideal, ".2f") for r in returns]),
        row(
            "time to first byte on them, p50 / longest (of the request answered: a restore's "
            "closed first request and the restore itself come before it)",
            [ttfb(r) for r in returns],
        ),
        row(
            "their recorded causes",
            ["; ".join(f"{c}: {n}" for c, n in r.causes) or "-" for r in returns],
        ),
        row(
            "every request: prompt tokens reused (hit rate)",
            [
                f"{f.reuse.cache_n} of {f.reuse.cache_n + f.reuse.prompt_n} "
                f"({_ratio(f.reuse.hit_rate, '.0%')}) in {f.reuse.requests} requests"
                for f in runs
            ],
        ),
        row("every request: durable causes recorded", causes),
        row("save folder at its peak, against the cap", [c[0] for c in folders]),
        row("samples (one a second) over the cap", [c[1] for c in folders]),
        row("save folder at the end", [c[2] for c in folders]),
    ]


def durable_section(runs: list[Figures]) -> list[str]:
    return [
        "## Durable sessions",
        "",
        "loopd saves a session's slot at the end of an answered turn where its rule finds the "
        "save pays (through brokerd, into the server's `--slot-save-path` folder, which brokerd "
        "keeps under `slot_save_max_bytes`) and restores it before a request when it knows the "
        "server lost the session, or when the request's first progress event shows it. A "
        "*return after a server kill* is a session's first completed request after the server "
        "lost every session (its model child killed, which the router starts again, or the "
        "whole server killed and started again), of a session that had one before; its *ideal* "
        "is its prompt less what the session's previous request left in the slot "
        "(`expected_reuse`), and for a request that opens a new epoch (after a compaction: a "
        "prompt no slot held) what it read. Read from loopd's perf records (`loopd perf "
        "--json`); the folder sampled once a second."
        + (" Both runs follow the same plan (seed)." if len(runs) > 1 else ""),
        "",
        *durable_rows(runs),
        "",
    ]


def _starts(exits: list[Exit], name: str) -> str:
    mine = [e for e in exits if e.name == name]
    killed = sum(e.killed_by_run for e in mine)
    return f"{len(mine)} exits ({killed} caused by the run)"


def _unexpected(exits: list[Exit]) -> str:
    bad = [e for e in exits if not e.killed_by_run]
    if not bad:
        return "0"
    return f"{len(bad)}: " + ", ".join(f"{e.name} {e.how}" for e in bad[:10])


KIND_COLOURS = {
    kind: colour
    for kind, colour in zip(
        FaultKind,
        (
            "tab:red",
            "tab:purple",
            "tab:brown",
            "darkred",
            "tab:pink",
            "tab:olive",
            "tab:cyan",
            "tab:orange",
            "tab:gray",
            "black",
            "tab:blue",
        ),
        strict=True,
    )
}


def latency_plot(figures: Figures, path: Path) -> None:
    """Turn latency over the run (dots, red when a fault was near), each fault a vertical line;
    below it, when the run sampled one, the save folder against its cap."""
    folder = figures.folder
    panels = 2 if folder is not None and folder.samples else 1
    figure = Figure(figsize=(11, 5 + 2.5 * (panels - 1)), dpi=100)
    grid = figure.add_gridspec(panels, 1, height_ratios=[2, 1][:panels])
    axes = figure.add_subplot(grid[0])
    t0 = figures.load_start
    for with_fault, colour, label in (
        (False, "tab:green", "turn"),
        (True, "tab:red", "turn near a fault"),
    ):
        group = [lat for lat in figures.latencies if lat.with_fault is with_fault]
        axes.scatter(
            [lat.end - t0 for lat in group],
            [lat.seconds for lat in group],
            s=14,
            c=colour,
            label=f"{label} ({len(group)})",
            zorder=3,
        )
    labelled: set[FaultKind] = set()
    for fault in figures.faults:
        axes.axvline(
            fault.at - t0,
            color=KIND_COLOURS[fault.kind],
            linestyle="-" if fault.fired else ":",
            linewidth=1.2,
            alpha=0.8,
            label=None if fault.kind in labelled else str(fault.kind),
        )
        labelled.add(fault.kind)
    axes.set_xlabel("seconds since the load began (reply time)")
    axes.set_ylabel("turn latency, s")
    axes.set_title(f"Turn latency, {figures.threads} threads on 2 slots, seed {figures.seed}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", ncols=2)
    if folder is not None and panels == 2:
        lower = figure.add_subplot(grid[1], sharex=axes)
        lower.plot(
            [t - t0 for t, _ in folder.samples],
            [b / (1 << 20) for _, b in folder.samples],
            color="tab:blue",
            label="loopd's saved states",
        )
        lower.axhline(folder.cap_bytes / (1 << 20), color="tab:red", linestyle="--", label="cap")
        for fault in figures.faults:
            if fault.kind in SERVER_KILLS and fault.struck is not None:
                lower.axvline(fault.struck - t0, color=KIND_COLOURS[fault.kind], linewidth=1.0)
        lower.set_ylabel("save folder, MiB")
        lower.set_xlabel("seconds since the load began")
        lower.grid(True, alpha=0.3)
        lower.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, format="png")
