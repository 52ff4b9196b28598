"""Save when it pays: whether a session's state is worth saving after a turn. Pure.

A save costs every turn that makes it: a read of the session's messages (the prefix the next
request extends, ``loopd.turn.saves``) and the state written to the server's disk. It pays
only on a return that finds the server lost the session (slept, unloaded, restarted, or gave
the slot to another session), and then only what a restore spares against reading the prompt
again. Measured on build 11434's tiny presets (``make bench``, the durable section): a turn
with a save took 1.44 times as long on the hybrid preset (134 against 93 ms), and a return
restored instead of re-read (about 440 ms) gained little over re-reading its 2,000 tokens
(about 600 ms); on production a 30,000-token re-read takes about 35 s.

So the rule weighs, from loopd's own measurements (``SaveFigures``; the self-test's save and
restore probe gives the first ones):

- *a re-read*: the state's tokens at the server's prompt speed (its own ``prompt_per_second``,
  on reads of at least ``MIN_READ_TOKENS``);
- *a restore*: the state's bytes (its fixed part and its part per token, from the saves'
  sizes) at the speed restores ran (until one ran, the speed saves wrote);
- *a save*: the prefix read's time and the state's bytes at the speed saves ran;
- *the chance a return finds its session lost*: the share of returns (a turn's first request
  after an earlier one of its session) whose cache lost at least half of what loopd expected
  the server to keep, counted with one lost and one kept return assumed before any is seen.

and saves when the expected gain on the next return, ``chance * (re-read - restore)``, is at
least what the save costs now. Where a figure is not measured yet, it saves: that save measures
it. Each decision, with its reason and figures, goes in the perf record of the request whose
state it concerns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

# Reads shorter than this are dominated by the request's own overhead: their speed says little
# of the server's prompt speed.
MIN_READ_TOKENS: Final = 64
# The saves whose sizes estimate a state's bytes: the latest few.
SIZES_KEPT: Final = 8
# A new measurement's weight in a running speed (an exponential average).
SPEED_WEIGHT: Final = 0.3


@dataclass(frozen=True)
class StateSize:
    """A saved state's bytes: a fixed part (a hybrid model's recurrent state) and a part per
    token (the attention layers' KV)."""

    fixed_bytes: float
    bytes_per_token: float

    def of(self, tokens: int) -> float:
        return self.fixed_bytes + self.bytes_per_token * tokens


def fit_size(sizes: list[tuple[int, int]]) -> StateSize | None:
    """The state size from saves' (tokens, bytes): a line through them (least squares) where
    they hold two lengths, else bytes per token through the origin; None without any."""
    points = [(t, b) for t, b in sizes if t > 0 and b > 0]
    if not points:
        return None
    tokens = [t for t, _ in points]
    if max(tokens) == min(tokens):
        return StateSize(0.0, sum(b / t for t, b in points) / len(points))
    mean_t = sum(tokens) / len(points)
    mean_b = sum(b for _, b in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t in tokens)
    slope = sum((t - mean_t) * (b - mean_b) for t, b in points) / spread
    slope = max(slope, 0.0)
    return StateSize(max(mean_b - slope * mean_t, 0.0), slope)


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + SPEED_WEIGHT * (new - old)


@dataclass
class SaveFigures:
    """What loopd measured of saving and reading on its server, kept in memory."""

    prompt_tokens_per_s: float | None = None
    save_bytes_per_s: float | None = None
    restore_bytes_per_s: float | None = None
    prefix_read_s: float | None = None
    returns: int = 0
    lost_returns: int = 0
    sizes: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=SIZES_KEPT))

    def read(self, prompt_n: int | None, prompt_ms: float | None) -> None:
        """A request's prompt read, as the server timed it."""
        if prompt_n is None or prompt_ms is None or prompt_n < MIN_READ_TOKENS or prompt_ms <= 0:
            return
        self.prompt_tokens_per_s = _average(self.prompt_tokens_per_s, prompt_n * 1000 / prompt_ms)

    def saved(self, tokens: int, n_bytes: int, ms: float, prefix_read_ms: float | None) -> None:
        """A save the server answered: its tokens, bytes and time, and the prefix read's."""
        if tokens > 0 and n_bytes > 0:
            self.sizes.append((tokens, n_bytes))
        if n_bytes > 0 and ms > 0:
            self.save_bytes_per_s = _average(self.save_bytes_per_s, n_bytes * 1000 / ms)
        if prefix_read_ms is not None and prefix_read_ms >= 0:
            self.prefix_read_s = _average(self.prefix_read_s, prefix_read_ms / 1000)

    def restored(self, n_bytes: int, ms: float) -> None:
        if n_bytes > 0 and ms > 0:
            self.restore_bytes_per_s = _average(self.restore_bytes_per_s, n_bytes * 1000 / ms)

    def returned(self, expected: int, lost: int) -> None:
        """A session's return: its first request held ``expected`` tokens the server was
        expected to keep, of which it lost ``lost``."""
        if expected <= 0:
            return
        self.returns += 1
        if lost * 2 >= expected:
            self.lost_returns += 1

    @property
    def chance_lost(self) -> float:
        """The share of returns that found their session lost (one of each assumed first)."""
        return (self.lost_returns + 1) / (self.returns + 2)


@dataclass(frozen=True)
class SaveDecision:
    save: bool
    reason: str
    tokens: int
    reread_s: float | None = None
    restore_s: float | None = None
    save_s: float | None = None
    chance_lost: float | None = None
    state_bytes: float | None = None

    def extra(self) -> dict[str, object]:
        """What the perf record says of it."""
        out: dict[str, object] = {
            "decision": "save" if self.save else "skip",
            "reason": self.reason,
            "tokens": self.tokens,
        }
        figures = {
            "reread_s": self.reread_s,
            "restore_s": self.restore_s,
            "save_s": self.save_s,
            "chance_lost": self.chance_lost,
            "state_bytes": self.state_bytes,
        }
        out.update({k: round(v, 4) for k, v in figures.items() if v is not None})
        return out


def decide(tokens: int, figures: SaveFigures) -> SaveDecision:
    """Whether the state of ``tokens`` tokens is worth saving now (see the module doc)."""
    if tokens <= 0:
        return SaveDecision(False, "the slot holds nothing of the session", tokens)
    size = fit_size(list(figures.sizes))
    unknown = [
        name
        for name, value in (
            ("the server's prompt speed", figures.prompt_tokens_per_s),
            ("a state's size", size),
            ("the save speed", figures.save_bytes_per_s),
            ("the prefix read's time", figures.prefix_read_s),
        )
        if value is None
    ]
    if unknown:
        why = f"not measured yet: {', '.join(unknown)}; this save measures what it can"
        return SaveDecision(True, why, tokens)
    assert size is not None
    assert figures.prompt_tokens_per_s is not None
    assert figures.save_bytes_per_s is not None
    assert figures.prefix_read_s is not None
    # Until a restore ran, it reads as fast as saves wrote.
    restore_bytes_per_s = figures.restore_bytes_per_s or figures.save_bytes_per_s
    state = size.of(tokens)
    reread_s = tokens / figures.prompt_tokens_per_s
    restore_s = state / restore_bytes_per_s
    save_s = figures.prefix_read_s + state / figures.save_bytes_per_s
    chance = figures.chance_lost
    gain_s = chance * (reread_s - restore_s)
    save = gain_s >= save_s
    reason = (
        f"a return re-reads {tokens} tokens in {reread_s:.3f} s or restores "
        f"{state / 1e6:.1f} MB in {restore_s:.3f} s, and {chance:.0%} of returns found their "
        f"session lost: {gain_s:.3f} s expected to gain against {save_s:.3f} s to save"
    )
    return SaveDecision(save, reason, tokens, reread_s, restore_s, save_s, chance, state)
