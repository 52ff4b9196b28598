"""Keeping a tool's output within its cap: a pure buffer that stops accepting bytes at the cap
and remembers that more was offered, so the reader can stop reading (and stop the tool)."""

from dataclasses import dataclass, field


@dataclass
class CappedOutput:
    """Output bytes kept up to ``cap``; ``cut`` is true once anything was dropped."""

    cap: int
    cut: bool = False
    encoding: str = "utf-8"
    _chunks: list[bytes] = field(default_factory=list)
    _size: int = 0

    def add(self, chunk: bytes) -> bool:
        """Keep what fits of ``chunk``; returns False once the cap is reached and input was cut."""
        room = self.cap - self._size
        if len(chunk) > room:
            self.cut = True
            chunk = chunk[:room]
        if chunk:
            self._chunks.append(chunk)
            self._size += len(chunk)
        return not self.cut

    @property
    def size(self) -> int:
        return self._size

    def text(self) -> str:
        """The kept bytes as text; a character split by the cap becomes U+FFFD, never an error."""
        data = b"".join(self._chunks)
        try:
            return data.decode(self.encoding, errors="replace")
        except LookupError:  # a charset name Python does not know
            return data.decode("utf-8", errors="replace")
