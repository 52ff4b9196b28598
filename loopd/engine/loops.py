"""Repetition in what the model writes as it streams: a thought or an answer going round in
circles. Pure: no I/O.

A model can think in a loop until its thinking cap (the same sentence again and again, or `?!`
for minutes), and the thinking cap is a blunt backstop: it fires late, and a loop pays every
token up to it. A ``RepetitionWatch`` reads the stream's pieces (each delta the server sends is
one token of the model's: ``timings_per_token`` streams them one by one) and tells when its
latest ``window`` tokens are mostly the same few phrases: the window's runs of ``N`` tokens (its
n-grams) are counted, and when fewer than ``SHARE`` of them are different the text is looping.
Ordinary prose and code repeat a phrase here and there, and their n-grams stay nearly all
different; a loop of P tokens has about P different n-grams however long it runs, so it is seen
once it has filled the window, for any P up to ``SHARE`` of the window.

The model's own tokens, not words: a thought of one long identifier again and again
(``<tort_think_tort_tort>``, seen on the tiny thinking preset) is many tokens a round, and a
window of words would fill only after thousands of tokens.

The stream (``loopd.engine.stream``) keeps a watch on the reasoning and one on the answer of each
request: a looping reasoning is ended by the control call before the cap
(``loopd.engine.thinkcap``), and a looping answer is closed and kept as written.
"""

from __future__ import annotations

from collections import Counter, deque
from itertools import islice

# The length of the runs of tokens compared.
N = 6
# Below this share of different n-grams in a full window, the text is looping.
SHARE = 0.2


class RepetitionWatch:
    """The latest ``window`` tokens of a streamed text, and whether they loop (``window`` 0:
    never)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.tokens = 0  # tokens seen in all
        self._recent: deque[str] = deque()
        self._grams: deque[tuple[str, ...]] = deque()
        self._counts: Counter[tuple[str, ...]] = Counter()

    def feed(self, piece: str) -> None:
        """Add the next token of the text (a delta, as it streamed)."""
        if self.window > 0 and piece:
            self._push(piece)

    @property
    def looping(self) -> bool:
        """The window is full, and fewer than ``SHARE`` of its n-grams are different."""
        if self.window <= 0 or len(self._recent) < self.window:
            return False
        return len(self._counts) < SHARE * len(self._grams)

    def _push(self, token: str) -> None:
        self.tokens += 1
        self._recent.append(token)
        if len(self._recent) >= N:
            gram = tuple(islice(self._recent, len(self._recent) - N, None))
            self._grams.append(gram)
            self._counts[gram] += 1
        if len(self._recent) > self.window:
            self._recent.popleft()
            if len(self._grams) > max(self.window - N + 1, 0):
                old = self._grams.popleft()
                self._counts[old] -= 1
                if not self._counts[old]:
                    del self._counts[old]
