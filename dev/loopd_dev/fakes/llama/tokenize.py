"""A deterministic fake tokenizer whose counts behave like a real one's.

Special markers are single tokens; other text splits into short words (with their leading space),
digit groups, single punctuation marks and single whitespace characters. Whitespace is never merged,
so a prompt that ends in a newline tokenizes the same alone as it does with text appended: the
property prefix caching needs.
"""

import re
import zlib
from dataclasses import dataclass

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)
EOS = "<|im_end|>"

_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")
_PIECE = re.compile(r" ?(?:[^\W\d_]{1,10}|\d{1,3}|[^\w\s]|_)|\s|.", re.DOTALL)
_SPECIAL_IDS = {token: index + 1 for index, token in enumerate(SPECIAL_TOKENS)}
_FIRST_PLAIN_ID = 1000
_VOCAB_SIZE = 49152


@dataclass(frozen=True)
class Token:
    """One token: its text and where it starts in the tokenized string."""

    piece: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.piece)


def tokenize_with_offsets(text: str, *, parse_special: bool = True) -> list[Token]:
    """Split ``text`` into tokens; with ``parse_special`` false, markers are plain text."""
    tokens: list[Token] = []
    offset = 0
    parts = _SPECIAL_SPLIT.split(text) if parse_special else [text]
    for part in parts:
        if parse_special and part in _SPECIAL_IDS:
            tokens.append(Token(part, offset))
        else:
            tokens.extend(Token(m.group(), offset + m.start()) for m in _PIECE.finditer(part))
        offset += len(part)
    return tokens


def tokenize(text: str, *, parse_special: bool = True) -> list[str]:
    """The token pieces of ``text``; the slots compare prompts by these."""
    return [token.piece for token in tokenize_with_offsets(text, parse_special=parse_special)]


def token_id(piece: str, *, special: bool = True) -> int:
    """A stable id for a piece: small fixed ids for markers, a hash for everything else."""
    if special and piece in _SPECIAL_IDS:
        return _SPECIAL_IDS[piece]
    return _FIRST_PLAIN_ID + zlib.crc32(piece.encode()) % (_VOCAB_SIZE - _FIRST_PLAIN_ID)
