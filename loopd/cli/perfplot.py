"""``loopd perf --plot FILE.png``: the per-request records drawn, one panel per figure.

matplotlib is an optional extra (``pip install 'loopd[plot]'``); it is imported only here, and
only when a plot is asked for. Panels, per request in time order (every session on one axis,
each session its own colour): prompt tokens evaluated (``prompt_n``) over those reused
(``cache_n``), the wait for the first token where a turn's wait ended (``loopd.engine.waits``),
and generated tokens per second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from loopd.engine.waits import person_wait_ms
from loopd.sessionlog.records import Request, RequestKind


class PlotError(Exception):
    """The plot cannot be drawn; the message says why in one line."""


def plot_requests(by_session: Mapping[str, Sequence[Request]], path: Path) -> int:
    """Draw the requests into ``path`` (PNG); the number of requests drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        from matplotlib import pyplot
    except ImportError:
        raise PlotError("needs matplotlib: pip install 'loopd[plot]'") from None
    drawn = {
        name: [r for r in rows if r.record.kind is not RequestKind.SELFTEST]
        for name, rows in by_session.items()
    }
    count = sum(len(rows) for rows in drawn.values())
    if count == 0:
        raise PlotError("no requests to draw")
    figure, (tokens, waits, speed) = pyplot.subplots(3, 1, figsize=(10, 8), sharex=True)
    for name, rows in drawn.items():
        if rows:
            _draw_session(name, rows, tokens, waits, speed)
    tokens.set_ylabel("prompt tokens")
    tokens.set_title("per request: prompt_n (solid) and cache_n (dotted)")
    waits.set_ylabel("wait for the first token (s)")
    speed.set_ylabel("tokens/s")
    speed.set_xlabel("time (UTC)")
    tokens.legend(loc="upper left", fontsize="small")
    figure.autofmt_xdate()
    figure.tight_layout()
    try:
        figure.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        pyplot.close(figure)
    return count


def _draw_session(name: str, rows: Sequence[Request], tokens: Any, waits: Any, speed: Any) -> None:
    times = [datetime.fromisoformat(r.created_at) for r in rows]
    perf = [r.record.perf for r in rows]
    (line,) = tokens.plot(times, [p.prompt_n for p in perf], marker=".", label=name)
    colour = line.get_color()
    tokens.plot(times, [p.cache_n for p in perf], linestyle=":", color=colour)
    waited = [person_wait_ms(p.extra) for p in perf]
    waits.plot(times, [None if w is None else w / 1000 for w in waited], marker=".", color=colour)
    speed.plot(times, [p.predicted_per_second for p in perf], marker=".", color=colour)
