"""What one audit row may hold (pure): bounded excerpts of the box's text, and a per-minute
budget of stored bytes for each session and for all sessions together.

A text field (a find_tool query, a call's arguments, a result) is stored as its first
``excerpt_bytes`` bytes, with its whole length and a sha256 of the whole: the row still says
what was asked, and a retry of the same call is still recognised, without storing a megabyte
per request. Beyond a budget the row is reduced to the fixed-size record (no text, only the
lengths and hashes), so the call is answered as always but the disk is not filled.
"""

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Excerpt:
    text: str  # what is stored: the first bytes of the whole ("" in a reduced row)
    size: int  # the whole's length in UTF-8 bytes
    sha256: str  # of the whole

    @property
    def dropped(self) -> int:
        return self.size - len(self.text.encode("utf-8"))


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def excerpt(text: str, max_bytes: int) -> Excerpt:
    data = text.encode("utf-8", "surrogatepass")
    kept = data[:max_bytes].decode("utf-8", "ignore") if len(data) > max_bytes else text
    return Excerpt(kept, len(data), hashlib.sha256(data).hexdigest())


def reduced(whole: Excerpt) -> Excerpt:
    return Excerpt("", whole.size, whole.sha256)


@dataclass
class WriteBudget:
    """Bytes of text each session, and all together, may store per minute of the clock."""

    per_session: int
    total: int
    _minute: int = -1
    _spent: dict[str, int] = field(default_factory=dict)

    def allow(self, session: str, size: int, minute: int) -> bool:
        """Whether ``size`` more bytes may be stored for ``session`` in ``minute`` (spent if so)."""
        if minute != self._minute:
            self._minute, self._spent = minute, {}  # the old minute's counts are not needed
        mine, everyone = self._spent.get(session, 0), self._spent.get("", 0)
        if mine + size > self.per_session or everyone + size > self.total:
            return False
        self._spent[session] = mine + size
        self._spent[""] = everyone + size
        return True
