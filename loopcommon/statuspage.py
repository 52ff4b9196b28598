"""loopd's status page: its data (the wait people saw for a turn's first token, slots, live turns,
sessions) and the page made from it, as plain HTML with inline SVG plots. Pure: no I/O.

loopd reads its runtime into a ``StatusSnapshot`` (``loopd.status.page``) and serves it as
``/status.json``; brokerd checks that data against these types and renders the page with
``render``, which escapes every string, so the box's bytes reach a browser as text only. A label
that came from people or the box (a session, a thread's channel, person and first words, a
phase) shows its hidden characters (``loopcommon.sanitize.visible``: a right-to-left override as
``<U+202E>``) and is isolated (``<bdi>``), so that nothing in it reorders the rest of its row. The
page refreshes itself, so a browser left on it follows the box without any script.

The data is bounded by its types, so that what the page costs does not grow with what the box
sends: at most ``MAX_SLOTS`` slots, ``MAX_LIVE`` live turns, ``MAX_SESSIONS`` sessions of
``PLOT_POINTS`` points each, strings of ``MAX_TEXT`` characters, counts below ``MAX_COUNT``.
brokerd refuses data past a bound at validation (and status data over ``STATUS_MAX_BYTES`` before
it); loopd cuts its own to them (``bounded``). The largest page they allow is well under
``PAGE_MAX_BYTES`` (tests/observe/test_status_bounds.py).
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import Field

from loopcommon.sanitize import visible

REFRESH_S: Final = 5
MAX_SLOTS: Final = 64
MAX_LIVE: Final = 100  # live turns listed (running or in line), the oldest first
MAX_SESSIONS: Final = 50  # the most recently active sessions listed
PLOT_POINTS: Final = 60  # the latest requests a session's plot shows
MAX_TEXT: Final = 256  # characters of any string (the page shows fewer)
MAX_PARTS: Final = 8  # the parts of the wait for a turn's first token (loopd records four)
MAX_COUNT: Final = 1 << 40  # tokens, requests, places in line
STATUS_MAX_BYTES: Final = 1024 * 1024  # status data as loopd writes it: the largest valid is 0.6 MB
PAGE_MAX_BYTES: Final = 2 * 1024 * 1024  # the page rendered from the largest status data

Text = Annotated[str, Field(max_length=MAX_TEXT)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Slot = Annotated[int, Field(ge=-1, le=MAX_COUNT)]  # -1: a session the server places
# A span of time, in seconds or (the wait's figures) in milliseconds.
Seconds = Annotated[float, Field(ge=0, le=MAX_COUNT, allow_inf_nan=False)]
LABEL_CHARS: Final = 64  # the most of a name (a channel, a person, a session) the page shows
FIRST_WORDS_CHARS: Final = 120
POST_ID: Final = re.compile(r"[a-z0-9]{26}")  # Mattermost's ids: nothing else goes in a link
WEB_URL: Final = re.compile(r"https?://[^\s\"'<>]+\Z")


@dataclass(frozen=True)
class SlotView:
    slot: Slot
    holder: Text | None  # the session holding it (for a prewarm: the session being warmed)
    phase: Text | None
    in_line: Count  # sessions waiting for it in loopd's line

    @property
    def busy(self) -> bool:
        return self.holder is not None


@dataclass(frozen=True)
class LiveView:
    session: Text
    slot: Slot
    phase: Text
    running_s: Seconds
    holding: bool
    ahead: Count


@dataclass(frozen=True)
class ThreadView:
    """A Mattermost thread's label: its root post, its channel (``~town-square``, or ``direct
    message``), the person who started it and its first words."""

    root: Text
    channel: Text
    person: Text
    first_words: Text


@dataclass(frozen=True)
class SessionView:
    name: Text
    slot: Slot
    requests: Count
    last_turn_at: Text | None
    hit_rate: Annotated[float, Field(ge=0, le=1)] | None
    # per request, oldest first (the latest PLOT_POINTS)
    prompt_n: Annotated[tuple[Count, ...], Field(max_length=PLOT_POINTS)]
    phase: Text | None  # the live turn's, if one runs
    thread: ThreadView | None = None  # a Mattermost thread's label


@dataclass(frozen=True)
class WaitView:
    """The wait people saw for a turn's first token over the latest turns: its p50 and p95, and
    each part's p50 (in milliseconds, named in a person's words, in order)."""

    turns: Count
    p50_ms: Seconds
    p95_ms: Seconds
    parts_p50_ms: Annotated[tuple[tuple[Text, Seconds], ...], Field(max_length=MAX_PARTS)]


@dataclass(frozen=True)
class StatusSnapshot:
    generated_at: Text
    model: Text
    slots: Annotated[tuple[SlotView, ...], Field(max_length=MAX_SLOTS)]
    live: Annotated[tuple[LiveView, ...], Field(max_length=MAX_LIVE)]
    sessions: Annotated[tuple[SessionView, ...], Field(max_length=MAX_SESSIONS)]
    waits: WaitView | None = None  # None: no turn has recorded its wait yet
    # Each model as its server last told it without waking it: awake, asleep, unloaded,
    # loading (one word where the servers agree, else one for each model in ``model``'s
    # order); "" where loopd has not read any.
    model_state: Text = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def bounded(snap: StatusSnapshot) -> StatusSnapshot:
    """``snap`` cut to the types' bounds: the first slots and live turns, the first sessions
    (loopd lists the most recently active first), each plot's latest points, every string's
    start. What loopd serves, so that brokerd never refuses loopd's own data."""
    return StatusSnapshot(
        generated_at=_cut(snap.generated_at),
        model=_cut(snap.model),
        slots=tuple(
            replace(s, holder=_cut_some(s.holder), phase=_cut_some(s.phase))
            for s in snap.slots[:MAX_SLOTS]
        ),
        live=tuple(
            replace(t, session=_cut(t.session), phase=_cut(t.phase)) for t in snap.live[:MAX_LIVE]
        ),
        sessions=tuple(_bounded_session(s) for s in snap.sessions[:MAX_SESSIONS]),
        waits=snap.waits,  # loopd's own figures and words, within the bounds as made
        model_state=_cut(snap.model_state),
    )


def _bounded_session(view: SessionView) -> SessionView:
    thread = view.thread
    if thread is not None:
        thread = ThreadView(*(_cut(text) for text in _texts(thread)))
    return replace(
        view,
        name=_cut(view.name),
        last_turn_at=_cut_some(view.last_turn_at),
        prompt_n=view.prompt_n[-PLOT_POINTS:],
        phase=_cut_some(view.phase),
        thread=thread,
    )


def _texts(thread: ThreadView) -> tuple[str, str, str, str]:
    return (thread.root, thread.channel, thread.person, thread.first_words)


def _cut(text: str) -> str:
    return text[:MAX_TEXT]


def _cut_some(text: str | None) -> str | None:
    return None if text is None else text[:MAX_TEXT]


STYLE: Final = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; } td, th { padding: .3em .8em; text-align: left; }
th { background: #eef; } tr:nth-child(even) td { background: #f7f7fa; }
.busy { color: #fff; background: #c60; padding: 0 .4em; border-radius: 3px; }
.idle { color: #fff; background: #393; padding: 0 .4em; border-radius: 3px; }
.muted { color: #777; } code { font-size: .95em; } td { white-space: nowrap; }
td.plot svg { vertical-align: middle; }
"""


def render(snap: StatusSnapshot, thread_url: str | None = None) -> str:
    """The page: one self-contained HTML document, no script. ``thread_url``: Mattermost's
    address, where each thread's label links to its thread (none: no links)."""
    e = html.escape
    threads = {s.name: s.thread for s in snap.sessions if s.thread is not None}
    named = functools.partial(_session_cell, threads=threads, thread_url=thread_url)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        f"<title>loopd: {len(snap.live)} live</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>loopd</h1>",
        f'<p class="muted">model <code>{label(snap.model)}</code>{_model_state(snap.model_state)}'
        f" · {e(snap.generated_at)} · refreshes every {REFRESH_S} s</p>",
        "<h2>The wait for the first token</h2>",
        _waits(snap.waits),
        "<h2>Slots</h2>",
        _slots_table(snap.slots, named),
        "<h2>Live turns</h2>",
        _live_table(snap.live, named),
        "<h2>Sessions</h2>",
        _sessions_table(snap.sessions, named),
        "</body></html>",
    ]
    return "\n".join(parts)


def _waits(waits: WaitView | None) -> str:
    if waits is None:
        return '<p class="muted">no turn has recorded its wait yet</p>'
    e = html.escape
    noun = "turn" if waits.turns == 1 else "turns"
    parts = "; ".join(f"{e(what)} {duration(ms)}" for what, ms in waits.parts_p50_ms)
    return (
        f"<p><b>p50 {duration(waits.p50_ms)}</b> · <b>p95 {duration(waits.p95_ms)}</b> over "
        f'the latest {waits.turns} {noun}</p><p class="muted">p50 of each part: {parts}</p>'
    )


def duration(ms: float) -> str:
    """``850 ms``, ``3.4 s``, ``2 min 5 s``: a wait as a person reads it."""
    if ms < 1000:
        return f"{ms:,.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:,.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def _model_state(state: str) -> str:
    """`` (awake)`` after the model's name; a model that holds nothing (asleep, unloaded,
    loading) is marked as a busy slot is, for the eye."""
    if not state:
        return ""
    shown = html.escape(state)
    if {"asleep", "unloaded", "loading"} & set(state.split(", ")):
        return f' <span class="busy">{shown}</span>'
    return f" ({shown})"


def _slots_table(slots: Sequence[SlotView], named: Callable[[str], str]) -> str:
    rows = ["<table><tr><th>slot</th><th>state</th><th>session</th><th>phase</th>"]
    rows.append("<th>in line</th></tr>")
    for s in slots:
        state = '<span class="busy">busy</span>' if s.busy else '<span class="idle">idle</span>'
        rows.append(
            f"<tr><td>{s.slot}</td><td>{state}</td><td>{named(s.holder) if s.holder else ''}</td>"
            f"<td>{label(s.phase or '')}</td><td>{s.in_line}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _live_table(live: Sequence[LiveView], named: Callable[[str], str]) -> str:
    if not live:
        return '<p class="muted">no turn is under way</p>'
    rows = ["<table><tr><th>session</th><th>slot</th><th>phase</th><th>for</th></tr>"]
    for t in live:
        phase = t.phase if t.holding else f"in line ({t.ahead} ahead)"
        rows.append(
            f"<tr><td>{named(t.session)}</td><td>{t.slot}</td><td>{label(phase)}</td>"
            f"<td>{t.running_s:.0f} s</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _sessions_table(sessions: Sequence[SessionView], named: Callable[[str], str]) -> str:
    if not sessions:
        return '<p class="muted">no sessions yet</p>'
    e = html.escape
    rows = [
        "<table><tr><th>session</th><th>slot</th><th>last turn</th><th>requests</th>"
        "<th>cache hit rate</th><th>prompt_n per request</th><th>now</th></tr>"
    ]
    for s in sessions:
        hit = "" if s.hit_rate is None else f"{s.hit_rate:.0%}"
        rows.append(
            f"<tr><td>{named(s.name)}</td><td>{s.slot}</td>"
            f"<td>{e(when(s.last_turn_at))}</td><td>{s.requests}</td><td>{hit}</td>"
            f'<td class="plot">{sparkline(s.prompt_n)}</td><td>{label(s.phase or "")}</td></tr>'
        )
    rows.append("</table>")
    return "".join(rows)


def _session_cell(name: str, *, threads: Mapping[str, ThreadView], thread_url: str | None) -> str:
    """A session as people know it: a Mattermost thread by its channel, its person and its
    first words (linked to the thread), then loopd's name for it. Everything the thread's
    label holds came from people or the box: each piece a ``label``."""
    code = f"<code>{label(name, LABEL_CHARS)}</code>"
    thread = threads.get(name)
    if thread is None:
        return code
    where = label(thread.channel, LABEL_CHARS)
    if thread_url is not None and POST_ID.fullmatch(thread.root) and WEB_URL.match(thread_url):
        link = f"{thread_url.rstrip('/')}/_redirect/pl/{thread.root}"
        where = f'<a href="{html.escape(link)}" rel="noreferrer">{where}</a>'
    words = label(thread.first_words, FIRST_WORDS_CHARS)
    person = label(thread.person, LABEL_CHARS)
    return f'{where} · @{person} · “{words}” <span class="muted">{code}</span>'


def label(text: str, limit: int | None = None) -> str:
    """A piece of text from people or the box, as the page shows it: cut to ``limit``
    characters (when given), its hidden characters shown, escaped, and isolated from its
    neighbours."""
    if not text:
        return ""
    return f"<bdi>{html.escape(visible(text[:limit]))}</bdi>"


def when(stamp: str | None) -> str:
    """A stored time (ISO, with its offset) as ``2026-05-01 12:00:07Z``."""
    if not stamp:
        return ""
    try:
        moment = datetime.fromisoformat(stamp).astimezone(UTC)
    except ValueError:
        return stamp
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def sparkline(values: Sequence[int], width: int = 180, height: int = 36) -> str:
    """An inline SVG of ``values`` (one point per request), its largest value beside it."""
    if not values:
        return '<span class="muted">none</span>'
    top = max(max(values), 1)
    step = width / max(len(values) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values)
    )
    last_x, last_y = points.rsplit(" ", 1)[-1].split(",")
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="prompt_n per request, largest {top}">'
        f'<polyline points="{points}" fill="none" stroke="#36c" stroke-width="1.5"/>'
        f'<circle cx="{last_x}" cy="{last_y}" r="2.5" fill="#c60"/></svg>'
        f' <span class="muted">max {top:,}</span>'
    )
