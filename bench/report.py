"""The Markdown report of one ``make bench`` run. Pure: results in, text out.

Each benchmark gets a table; repeated measurements show min / median / max; every target of the
issue is checked in one table at the top, and the ones that fall short say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.cache_reuse import CUT_REPLY, CacheResult, CacheRow
from bench.hybrid import HybridRow
from bench.ideal import TOLERANCE, Label
from bench.machine import Machine
from bench.memory import MemorySample
from bench.overhead import CpuShare, LogCost
from bench.parsers import ParserRow
from bench.placement import PlacementRun
from bench.placement import section as placement_section
from bench.pool import Layout, PoolRequest, PoolSummary, summarize
from bench.stats import Spread
from bench.switching import SwitchRow, TurnSample
from loopd_dev.devserver import EVERY_TURN_MODEL, HYBRID_MODEL, THINKING_MODEL

COMMAND = "make bench"
NAIVE_RATIO_TARGET = 10.0
CPU_SHARE_TARGET = 0.01
BUILD_10K_TARGET_MS = 20.0
# The production model's generation speed, tokens per second (seed 000, benchmark table).
PRODUCTION_TOKENS_PER_S = (28, 69)


@dataclass(frozen=True)
class Results:
    date: str
    started: str
    duration_s: float
    machine: Machine
    load_before: str
    load_after: str
    repeats: int
    reference_parser: str
    parsers: list[ParserRow]
    log: LogCost
    memory: list[MemorySample]
    cpu: list[CpuShare] = field(default_factory=list)
    server: str | None = None  # what served the server benchmarks; None when they were skipped
    # The scripted session on each preset, thinking first; with the PNG of each, by position.
    caches: list[CacheResult] = field(default_factory=list)
    switching: list[SwitchRow] | None = None
    switching_turns: list[TurnSample] = field(default_factory=list)
    plot_files: list[str] = field(default_factory=list)
    # Pinning on a unified pool (bench/pool.py) and the hybrid model's losses (bench/hybrid.py).
    pool_layouts: list[Layout] = field(default_factory=list)
    pool: list[PoolRequest] | None = None
    hybrid: list[HybridRow] | None = None
    placement: list[PlacementRun] | None = None  # sessions across endpoints (bench/placement.py)
    scale: list[str] = field(default_factory=list)  # its Markdown lines (bench/scale.py)
    command: str = COMMAND  # what made the report, as typed
    title: str = ""  # the report's heading; the date when empty


@dataclass(frozen=True)
class Check:
    target: str
    measured: str
    met: bool | None  # None: not measured in this run
    why: str = ""  # when not met: the reason


def spread(value: Spread, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    parts = (value.minimum * scale, value.median * scale, value.maximum * scale)
    return " / ".join(f"{part:,.{digits}f}" for part in parts) + unit


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    return lines


def render(results: Results) -> str:
    lines = [f"# loopd benchmarks, {results.title or results.date}", ""]
    lines += _header(results)
    lines += ["", "## Targets", ""]
    checks = targets(results)
    lines += table(
        ["Target", "Measured", "Met"],
        [(c.target, c.measured, _met(c.met)) for c in checks],
    )
    short = [c for c in checks if c.met is False and c.why]
    if short:
        lines += ["", "Where a target falls short:", ""]
        lines += [f"- **{c.target}**: {c.why}" for c in short]
    lines += [""]
    lines += _cache_sections(results)
    lines += ["", *_cost_section(results)]
    lines += ["", *_switching_section(results), ""]
    lines += [*_pool_section(results), ""]
    lines += [*_hybrid_section(results), ""]
    if results.placement:
        lines += [*placement_section(results.placement, results.date), ""]
    if results.scale:
        lines += [*results.scale, ""]
    return "\n".join(lines)


def _met(met: bool | None) -> str:
    return "not measured" if met is None else ("yes" if met else "**no**")


def _header(r: Results) -> list[str]:
    m = r.machine
    return [
        f"- Command: {_command(r.command)}, started {r.started}, took {r.duration_s / 60:.1f} min.",
        f"- Machine: {m.cores} cores (`nproc`), {m.memory_gib:.1f} GiB memory, {m.cpu_model}; "
        f"{m.system}, Python {m.python}.",
        f"- Load average (1/5/15 min) before: {r.load_before}; after: {r.load_after}. Other work "
        "on the machine slows every timing; token counts are exact whatever the load.",
        f"- Server: {r.server or 'not run (--offline)'}.",
        f"- Repeated measurements: {r.repeats} runs, shown as min / median / max.",
    ]


def _command(command: str) -> str:
    if command == COMMAND:
        return f"`{COMMAND}` (runs `.venv/bin/python -m bench`)"
    return f"`{command}`"


# -- targets ----------------------------------------------------------------------------------


def targets(r: Results) -> list[Check]:
    per_preset: list[Check] = []
    for cache in r.caches:
        per_preset += [_ideal_check(cache), _ratio_check(cache)]
    if not r.caches:
        per_preset = [_ideal_check(None), _ratio_check(None)]
    return [
        *per_preset,
        _cpu_check(r.cpu),
        _build_check(r.log),
        _parser_check(r.parsers, r.reference_parser),
    ]


def _on(cache: CacheResult | None) -> str:
    return "" if cache is None else f" (`{cache.settings.model}`)"


def _ideal_check(cache: CacheResult | None) -> Check:
    target = (
        f"loopd's prompt_n within {TOLERANCE} tokens of the ideal (unlabelled requests){_on(cache)}"
    )
    if cache is None:
        return Check(target, "-", None)
    judged = [row for row in cache.rows if row.label is Label.NONE]
    misses = cache.misses()
    worst = max((row.over_ideal for row in judged), default=0)
    measured = f"{len(judged) - len(misses)} of {len(judged)}; worst {worst:+d} tokens"
    why = ""
    if misses:
        numbers = ", ".join(f"#{row.index} ({row.over_ideal:+d})" for row in misses)
        why = (
            f"requests {numbers} re-read more than the tokens new to them; see the cache table "
            "(a request after a reply cut by max_tokens, or a server checkpoint boundary)."
        )
    return Check(target, measured, not misses, why)


def _ratio_check(cache: CacheResult | None) -> Check:
    target = (
        f"the naive client processes at least {NAIVE_RATIO_TARGET:g}x loopd's prompt tokens"
        f"{_on(cache)}"
    )
    if cache is None:
        return Check(target, "-", None)
    ratio = cache.naive_over_loopd
    met = ratio >= NAIVE_RATIO_TARGET
    why = ""
    if not met:
        bound = cache.naive_total / max(cache.ideal_total, 1)
        why = (
            f"even the ideal client (the tokens new to each request, {cache.ideal_total:,} in "
            f"all) is only {bound:.1f}x cheaper than the naive one here, so no client reaches "
            f"{NAIVE_RATIO_TARGET:g}x on this template and script. "
        )
        if cache.rewritten_total:
            why += (
                f"The template rewrites what was sent: {cache.rewritten_total:,} of the ideal's "
                "tokens are earlier turns read again because the template drops their reasoning "
                "once a new user message follows (labelled rows); loopd pays them as any client "
                "would. "
            )
        why += (
            "The naive client's cost grows with the square of the session's length and loopd's "
            "linearly, so a longer session widens the gap."
        )
    return Check(target, f"{ratio:.1f}x ({cache.naive_total:,} / {cache.loopd_total:,})", met, why)


def _cpu_check(cpu: Sequence[CpuShare]) -> Check:
    target = f"loopd's CPU under {CPU_SHARE_TARGET:.0%} of a turn's wall time"
    if not cpu:
        return Check(target, "-", None)
    worst = max(share.share.median for share in cpu)
    measured = "; ".join(f"{c.what}: median {c.share.median:.2%}" for c in cpu)
    why = ""
    if worst >= CPU_SHARE_TARGET:
        why = (
            "the tiny model on the CPU answers in well under a second, so a turn's fixed costs "
            "(building the request, the HTTP exchange, parsing each token's event, the log's "
            "fsynced appends) weigh far more than against a production model's seconds-long turn."
        )
        per_token = [c.per_token_ms.median for c in cpu if c.per_token_ms is not None]
        if per_token:
            ms = max(per_token)
            slow, fast = PRODUCTION_TOKENS_PER_S
            why += (
                f" Per generated token loopd spends a median {ms:.2f} ms of CPU (a request's CPU "
                "over the few tokens the tiny model generates per request, its fixed costs "
                "included, so an upper bound for longer answers; most of it is reading the "
                "stream's chunks through httpx, httpcore and anyio); against the production "
                f"model's {slow} to {fast} tokens/s (seed 000) that is at most "
                f"{ms * slow / 10:.1f}% to {ms * fast / 10:.1f}% of its generation time."
            )
    return Check(target, measured, worst < CPU_SHARE_TARGET, why)


def _build_check(log: LogCost) -> Check:
    target = f"10,000-entry request build under {BUILD_10K_TARGET_MS:g} ms"
    build = log.build_ms.get(10_000)
    if build is None:
        return Check(target, "-", None)
    met = build.median < BUILD_10K_TARGET_MS
    why = "" if met else "reading 10,000 entries back from SQLite dominates; see the log table."
    return Check(target, f"median {build.median:.2f} ms (max {build.maximum:.2f})", met, why)


def _parser_check(rows: Sequence[ParserRow], reference: str) -> Check:
    """Judged on the SSE level, where both sides do the same work; at the events level loopd
    also builds typed events, which the reference (payloads through ``json.loads``) does not."""
    target = f"stream parser (SSE) at least as fast as the reference ({reference})"
    ratios = {key: ratio for key, ratio in parser_ratios(rows).items() if key[0] == "SSE"}
    if not ratios:
        return Check(target, "-", None)
    worst = min(ratios.values())
    measured = ", ".join(f"{cut}: {ratio:.2f}x" for (_, cut), ratio in ratios.items())
    why = "" if worst >= 1 else "see the parser table."
    return Check(target, measured, worst >= 1, why)


def parser_ratios(rows: Sequence[ParserRow]) -> dict[tuple[str, str], float]:
    """loopd's median events/s over the reference's, per level and chunking."""
    ratios = {}
    for row in rows:
        if row.parser.startswith("loopd"):
            others = [o for o in rows if (o.level, o.cut) == (row.level, row.cut) and o is not row]
            if others:
                ratios[(row.level, row.cut)] = (
                    row.events_per_second.median / others[0].events_per_second.median
                )
    return ratios


# -- sections ---------------------------------------------------------------------------------


TEMPLATES = {
    THINKING_MODEL: "the Qwen3.5-4B template: the model thinks, tools are rendered before the "
    "system text, earlier reasoning is dropped at each new user message",
    EVERY_TURN_MODEL: "the same template changed in one condition to render every assistant "
    "turn's reasoning, as the production template does (docs/design, behaviour (e))",
    HYBRID_MODEL: "the tiny random-weight qwen35moe (production's architecture: recurrent and "
    "attention layers, MoE) on production's layout, four slots on one unified pool, with the "
    "every-turn reasoning template; its tokenizer is SmolLM2's, cut short, and its text "
    "random, see the hybrid section",
}


def _cache_sections(r: Results) -> list[str]:
    if not r.caches:
        return ["## Cache reuse: loopd against a naive client", "", "Not run (`--offline`)."]
    return cache_sections(r.caches, r.plot_files)


def cache_sections(caches: Sequence[CacheResult], plot_files: Sequence[str]) -> list[str]:
    """A section per preset of the cache benchmark (in the full report or alone)."""
    lines: list[str] = []
    for index, cache in enumerate(caches):
        plot = plot_files[index] if index < len(plot_files) else None
        lines += _cache_section(cache, plot, first=index == 0)
        lines += [""]
    return lines[:-1]


def _cache_section(cache: CacheResult, plot_file: str | None, *, first: bool) -> list[str]:
    s = cache.settings
    template = TEMPLATES.get(s.model, "its own template")
    lines = [f"## Cache reuse on `{s.model}`: loopd against a naive client", ""]
    matches = sum(row.counted_matches_server for row in cache.rows)
    lines += [
        f"One scripted session of {len(cache.rows)} requests on the `{s.model}` preset "
        f"({template}), run through loopd and then through the naive client (`bench/naive.py`: "
        "rebuilds messages from parsed fields, re-dumps tool arguments with `json.dumps`, drops "
        "`reasoning_content`, puts the time in the system line, a minute later each request). "
        "Greedy sampling, the "
        "same for both. The naive client runs second: its first request finds in the server's "
        "cache what loopd's first request left there (its *naive cache_n*), which favours it.",
        "",
    ]
    if first:
        lines += [
            "- **Scripted replies.** The tiny model never makes a tool call on its own, so every "
            "tool-calling assistant message is scripted (`bench/script.py`): one is the real call "
            "recorded from this server (`tests/data/streams/tool_call.sse`), the others have its "
            "shape, with reasoning. loopd appends them to its log as if streamed; the naive "
            "client parses them like a reply. Requests answered by a scripted message are sent "
            f"with `max_tokens` {s.scripted_max_tokens} (the whole prompt is still processed). "
            "Each turn's final answer is the model's own, thinking included where the preset "
            f"thinks (`max_tokens` {s.max_tokens}).",
            "- **Ideal** (`bench/ideal.py`): the tokens of the request, counted by the server's "
            "`/apply-template` and `/tokenize` on loopd's exact body, after the longest common "
            "prefix with the previous request's prompt followed by the previous reply's "
            "generated tokens (when that reply is the model's own). Text the template rewrote "
            "counts as new: no client avoids it.",
            "- **Labels**: *first of the epoch*; *template drops reasoning* (the template "
            "renders reasoning only after the last user message, so each new user turn re-reads "
            "the previous turn); *after a capped reply* (loopd's thinking cap ended the "
            "reasoning); *reply tokenized anew* (the server kept the previous prompt but only part "
            "of the model's reply: replayed byte for byte, the reply's text tokenizes differently "
            "from the tokens the model generated, for example whitespace generated as two tokens "
            "that tokenizes as one; no client that sends text avoids it); *prompt's last piece "
            "tokenized anew* (the previous prompt's text is still there, but its last token came "
            "out differently once text followed: a byte-level BPE splits a run of whitespace "
            "before a word, so the `\\n\\n` ending a generation prompt becomes two `\\n`); "
            "*resumed at a checkpoint* (the hybrid model's server went back "
            "to the checkpoint 4 tokens before the previous prompt's end, before the point where "
            "the prompt diverged; shown after another label as *resumed N tokens earlier*).",
        ]
    else:
        lines += ["- The same script, scripted replies, ideal and labels as above."]
    lines += [
        f"- The server's count equals loopd's cache_n + prompt_n on {matches} of "
        f"{len(cache.rows)} requests.",
        *_cut_replies(cache.rows),
        "",
    ]
    lines += table(
        [
            "#",
            "turn",
            "after",
            "reply",
            "prompt tokens",
            "ideal",
            "loopd cache_n",
            "loopd prompt_n",
            "loopd - ideal",
            "naive cache_n",
            "naive prompt_n",
            "label",
        ],
        [_cache_cells(row) for row in cache.rows],
    )
    bound = cache.naive_total / max(cache.ideal_total, 1)
    lines += [
        "",
        *table(
            ["Total prompt_n", "Tokens", "Ratio"],
            [
                ("ideal", f"{cache.ideal_total:,}", ""),
                ("loopd", f"{cache.loopd_total:,}", f"{cache.loopd_over_ideal:.2f}x the ideal"),
                (
                    "naive",
                    f"{cache.naive_total:,}",
                    f"{cache.naive_over_loopd:.1f}x loopd ({bound:.1f}x the ideal)",
                ),
            ],
        ),
    ]
    lines += _mistakes_alone(cache)
    if plot_file:
        lines += ["", f"![prompt_n per request on {s.model}, loopd against naive]({plot_file})"]
    return lines


def _mistakes_alone(cache: CacheResult) -> list[str]:
    """What each of the naive client's mistakes costs alone, against loopd and all of them."""
    if not cache.mistakes_alone:
        return []
    ours, every = cache.loopd_after_first, cache.naive_after_first
    lines = [
        "",
        "The naive client again, making one of its mistakes only (the same script). Each run "
        "starts on the cache the run before it left, so the runs are compared on the requests "
        "after their first:",
        "",
    ]
    rows = [
        ("loopd", f"{ours:,}", "1.00x", ""),
        ("every mistake", f"{every:,}", _times(every, ours), "100%"),
    ]
    rows += [
        (
            f"{alone.mistake.value} alone",
            f"{alone.prompt_n_after_first:,}",
            _times(alone.prompt_n_after_first, ours),
            _share(alone.prompt_n_after_first - ours, every - ours),
        )
        for alone in cache.mistakes_alone
    ]
    return lines + table(
        [
            "Client",
            "prompt_n after the first request",
            "x loopd",
            "share of every mistake's excess",
        ],
        rows,
    )


def _times(tokens: int, ours: int) -> str:
    return f"{tokens / max(ours, 1):.2f}x"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "n/a"


def _cut_replies(rows: Sequence[CacheRow]) -> list[str]:
    cut = [row.index for row in rows if row.reply == CUT_REPLY]
    if not cut:
        return []
    numbers = ", ".join(f"#{index}" for index in cut)
    return [
        f"- **Replies not replayed.** The model's answers to requests {numbers} imitated the "
        "scripted calls and were cut by `max_tokens` inside a tool call, with arguments that are "
        "not JSON. The server refuses to render such a message (HTTP 500 on every later "
        "request), so the benchmark records it as broken (kept in the log, never replayed) and "
        "the ideal does not count it as cached."
    ]


def _cache_cells(row: CacheRow) -> list[object]:
    over = f"{row.over_ideal:+d}"
    if row.label is Label.NONE and not row.meets_target:
        over = f"**{over}**"
    return [
        row.index,
        row.turn,
        row.after,
        row.reply,
        f"{row.prompt_tokens:,}",
        f"{row.ideal:,}",
        f"{row.loopd_cache_n:,}",
        f"{row.loopd_prompt_n:,}",
        over,
        f"{row.naive_cache_n:,}",
        f"{row.naive_prompt_n:,}",
        _why(row),
    ]


def _why(row: CacheRow) -> str:
    """The row's label, and a checkpoint resume on top of another cause."""
    if row.label in (Label.CHECKPOINT, Label.NONE) or row.before_divergence <= TOLERANCE:
        return row.label.value
    return f"{row.label.value}; resumed {row.before_divergence} tokens earlier, at a checkpoint"


def _cost_section(r: Results) -> list[str]:
    lines = ["## loopd's own cost", "", "### Stream parser", ""]
    lines += [
        f"All recorded streams in `tests/data/streams/` (the same bytes for every parser), in "
        f"SSE events per second. Reference: {r.reference_parser}. *SSE*: bytes to event "
        "payloads. *events*: bytes to parsed chunks (loopd's typed events; the reference's "
        "payloads through `json.loads`). Every parser is first checked to give the same "
        "payloads as loopd's. The target is judged on the SSE level, where both do the same "
        "work; at the events level loopd also builds a typed event for every field it uses.",
        "",
    ]
    ratios = parser_ratios(r.parsers)
    lines += table(
        ["Level", "Chunks", "Parser", "Events/s (min / median / max)", "loopd / reference"],
        [
            (
                row.level,
                row.cut,
                row.parser,
                spread(row.events_per_second, 0),
                f"{ratios[(row.level, row.cut)]:.2f}x" if row.parser.startswith("loopd") else "",
            )
            for row in r.parsers
        ],
    )
    log = r.log
    lines += ["", "### Session log", ""]
    lines += [
        f"`loopd_dev.sessionlog_bench.measure`, a fresh log per run: {log.appends} single appends "
        "(each its own fsynced transaction), and the time to build a request's messages "
        "(replay and join) for sessions of each size.",
        "",
    ]
    rows: list[tuple[str, str]] = [
        ("append p50 (ms)", spread(log.append_p50_ms, 3)),
        ("append p99 (ms)", spread(log.append_p99_ms, 3)),
    ]
    rows += [(f"build, {size:,} entries (ms)", spread(v, 3)) for size, v in log.build_ms.items()]
    lines += table(["Measure", "min / median / max"], rows)
    lines += ["", "### CPU share of a turn", ""]
    lines += [
        "loopd's process CPU time during a turn (or request) over its wall time, against the "
        "real server (the server's own CPU is another process and is not counted).",
        "",
    ]
    lines += table(
        ["Turns", "Count", "CPU / wall (min / median / max)", "CPU per generated token (ms)"],
        [
            (
                c.what,
                c.share.count,
                spread(c.share, 2, 100, " %"),
                spread(c.per_token_ms, 2) if c.per_token_ms is not None else "-",
            )
            for c in r.cpu
        ]
        or [("-", 0, "", "")],
    )
    lines += ["", "### Memory with idle sessions", ""]
    if r.memory:
        sessions = r.memory[0].sessions
        lines += [
            f"A fresh process opens loopd's `Runtime`, then creates {sessions} idle sessions "
            "(an epoch and 5 finished turns each, state derived once).",
            "",
        ]
        before = Spread.of([m.rss_before_mib for m in r.memory])
        after = Spread.of([m.rss_after_mib for m in r.memory])
        per_session = Spread.of([m.per_session_kib for m in r.memory])
        lines += table(
            ["Measure", "min / median / max"],
            [
                ("RSS, runtime open (MiB)", spread(before)),
                (f"RSS, {sessions} idle sessions (MiB)", spread(after)),
                ("per idle session (KiB)", spread(per_session)),
            ],
        )
    return lines


def _switching_section(r: Results) -> list[str]:
    lines = ["## Thread switching on one slot", ""]
    if r.switching is None:
        return [*lines, "Not run (`--offline`)."]
    lines += [
        "1, 2 and 4 sessions pinned to slot 0 of a preset, host prompt cache on (`--cache-ram`): "
        "the plain SmolLM2 preset (two slots of their own) and the hybrid preset (four slots on "
        "one unified pool, production's layout). Each session first reads its own report (120 "
        "words), then they take turns for two more rounds; with more than one session every "
        "later turn follows another session's turn. *Re-read* is loopd's own cache-loss figure: "
        "the reuse an exact replay should get, less the server's cache_n. *Before generation*: "
        "from sending to the first generated token (queue, restoring a saved prompt, prompt "
        "processing).",
        "",
    ]
    lines += table(
        [
            "Preset",
            "Sessions on the slot",
            "Later turns",
            "Switches",
            "Re-read tokens",
            "prompt_n",
            "Before generation (s)",
        ],
        [
            (
                f"`{row.model}`",
                row.sessions,
                row.turns,
                row.switches,
                spread(row.cache_loss, 0),
                spread(row.prompt_n, 0),
                spread(row.prompt_phase_s, 2),
            )
            for row in r.switching
        ],
    )
    explained = [t for t in r.switching_turns if t.server_says]
    if explained:
        lines += [
            "",
            "Every turn on the hybrid preset, with the cause loopd recorded (`loopd perf`) and "
            "what the server logged for the request:",
            "",
        ]
        lines += table(
            ["Sessions", "Session", "Round", "cache_n", "Re-read", "loopd's cause", "The server"],
            [
                (
                    t.sessions,
                    t.session,
                    t.round,
                    t.cache_n,
                    t.cache_loss,
                    t.loopd_cause or "-",
                    t.server_says,
                )
                for t in explained
            ],
        )
    return lines


# -- the unified pool and the hybrid model ------------------------------------------------------


def _pool_section(r: Results) -> list[str]:
    lines = ["## Pinning on a unified pool", ""]
    if r.pool is None:
        return [*lines, "Not run (`--offline`)."]
    lines += [
        "`bench/pool.py`: N sessions (2, 4, 6) take turns on four slots for three rounds, with "
        "scripted replies (`max_tokens` 1, so the slot holds exactly the prompt), *pinned* each "
        "to its own slot (i mod 4, loopd with `LOOPD_SLOTS=0,1,2,3`), all *pinned* to slot 0, "
        "or *unpinned* (`id_slot` -1: the server picks the slot by prompt similarity, else the "
        "least recently used one, restoring from its host cache). A fourth scenario puts "
        "another client's long, unrelated prompt before each later turn of one session. Each "
        "cause is what the server logged for that request (`-lv 4`, read by "
        "`bench/serverlog.py`). *Reuse*: the later requests' cache_n over what each session "
        "had left in the server; *kept*: within 2 tokens of it. On the hybrid model a prompt "
        "that diverges inside what the slot holds resumes at the checkpoint 4 tokens before the "
        "end of the previous prompt (*to the checkpoint*).",
        "",
    ]
    described = {layout.name: layout for layout in r.pool_layouts}
    rows = []
    for summary in summarize(r.pool):
        layout = described.get(summary.layout)
        where = (
            f"{layout.model}, {layout.flags}"
            + (" **(production's default)**" if layout.production_default else "")
            if layout is not None
            else summary.layout
        )
        rows.append(_pool_cells(where, summary))
    lines += table(
        [
            "Layout",
            "Scenario",
            "Sessions",
            "Later requests",
            "Kept",
            "To the checkpoint",
            "Reuse",
            "Causes of the losses (requests)",
        ],
        rows,
    )
    defaults = [layout for layout in r.pool_layouts if layout.production_default]
    for layout in defaults:
        lines += ["", *_pool_requests(layout, r.pool)]
    return lines


def _pool_cells(where: str, s: PoolSummary) -> list[object]:
    causes = "; ".join(f"{count}x {cause}" for cause, count in s.causes.items())
    return [
        where,
        s.scenario,
        s.sessions,
        s.later,
        s.kept,
        s.to_checkpoint,
        f"{s.reuse:.0%}",
        causes or "-",
    ]


def _pool_requests(layout: Layout, requests: Sequence[PoolRequest]) -> list[str]:
    """Every request of four sessions on four slots, pinned and unpinned, on one layout."""
    chosen = [
        q
        for q in requests
        if q.layout == layout.name
        and q.sessions == 4
        and q.scenario in ("pinned, own slots", "unpinned")
    ]
    lines = [
        f"Four sessions on `{layout.name}` ({layout.model}, {layout.flags}), every request:",
        "",
    ]
    lines += table(
        ["Scenario", "Round", "Session", "id_slot", "Ran on", "Held", "cache_n", "prompt_n", "Why"],
        [
            (
                q.scenario,
                q.round,
                q.session,
                q.slot_sent,
                "?" if q.slot_used is None else q.slot_used,
                q.held,
                q.cache_n,
                q.prompt_n,
                q.cause,
            )
            for q in chosen
        ],
    )
    return lines


def _hybrid_section(r: Results) -> list[str]:
    lines = ["## Where a hybrid model's cache goes", ""]
    if r.hybrid is None:
        return [*lines, "Not run (`--offline`)."]
    lines += [
        "`bench/hybrid.py`: one session of five turns alone on a one-slot server (host cache "
        "off), the tiny hybrid `qwen35moe` and SmolLM2 side by side. *Held*: what the slot held "
        "after the previous request (prompt and generated, less the last token). *Divergence*: "
        "the tokens this prompt shares with the previous prompt, by the server's own "
        "`/tokenize`. Causes from those tokens and the server's log.",
        "",
    ]
    lines += table(
        ["Model", "Variant", "Turn", "Prompt", "Held", "Divergence", "cache_n", "prompt_n", "Why"],
        [
            (
                row.model,
                row.variant,
                row.turn,
                row.prompt_tokens,
                row.held,
                "-" if row.divergence is None else row.divergence,
                row.cache_n,
                row.prompt_n,
                row.cause,
            )
            for row in r.hybrid
        ],
    )
    return lines
