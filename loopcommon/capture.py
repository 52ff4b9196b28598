"""A program's output kept within a cap (pure): the tools of both daemons write into one.

``CappedOutput`` keeps the first bytes up to the cap; with ``tail_bytes`` it keeps the last ones
too (the end of a build's output is where its error is), and never holds more than the cap
either way. ``total`` counts every byte offered. A head-only output tells its reader when the
rest would be dropped unseen, so the reader can stop reading and stop the program (brokerd's
tools); one with a tail is read to the end (loopd's ``run_command``).
"""

from dataclasses import dataclass, field


@dataclass
class CappedOutput:
    """Output bytes kept up to ``cap`` in all: the head, and the last ``tail_bytes`` of them."""

    cap: int
    tail_bytes: int = 0
    encoding: str = "utf-8"
    total: int = field(default=0, init=False)
    _head: bytearray = field(default_factory=bytearray, init=False, repr=False)
    _tail: bytearray = field(default_factory=bytearray, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.tail_bytes <= self.cap:
            raise ValueError(f"tail_bytes {self.tail_bytes} is not within the cap {self.cap}")

    @property
    def held(self) -> int:
        return len(self._head) + len(self._tail)

    @property
    def cut(self) -> bool:
        """True once anything offered is not kept."""
        return self.total > self.held

    def add(self, chunk: bytes) -> bool:
        """Keep what the cap allows of ``chunk``; False once more would be dropped unseen (the
        head is full and no tail is kept), so the reader may stop."""
        self.total += len(chunk)
        room = self.cap - self.tail_bytes - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_bytes:
            self._tail += chunk[-self.tail_bytes :]
            del self._tail[: max(0, len(self._tail) - self.tail_bytes)]
        return self.tail_bytes > 0 or not self.cut

    def text(self) -> str:
        """The kept bytes as text; a character split by the cap becomes U+FFFD, never an error.

        With a tail, a cut shows as a line between the head and the tail saying how much was
        left out. A head-only output ends where the cap cut it: its reader says so (brokerd
        names the cap in the result).
        """
        if not self.cut:
            # Decoded together: a character may straddle the head and the tail.
            return self._decode(self._head + self._tail)
        head = self._decode(self._head)
        if not self.tail_bytes:
            return head
        left_out = self.total - self.held
        return (
            f"{head}\n[output cut: {self.total:,} bytes in all; {left_out:,} bytes in the "
            f"middle are not shown]\n{self._decode(self._tail)}"
        )

    def _decode(self, data: bytes | bytearray) -> str:
        try:
            return bytes(data).decode(self.encoding, errors="replace")
        except LookupError:  # a charset name Python does not know
            return bytes(data).decode("utf-8", errors="replace")
