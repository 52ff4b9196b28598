"""The names of loopd's saved slot states in llama-server's ``--slot-save-path`` folder.

A name is built from the session, the fingerprint of the model that wrote the state and a hash
of the exact prefix the state holds::

    loopd-<16 hex of sha256(session)>-<12 hex fingerprint>-<32 hex of sha256(prefix)>.bin

so no session can restore another's state (its own name differs in the first part), a state is
never restored into other weights or under another template (the fingerprint,
``loopd.engine.modelstate``, differs in the second), and a stale file cannot pass for a current
one (a different prefix hashes to a different third part). The prefix is given either as bytes
(the request as loopd renders it) or as token ids; the two are hashed under different tags, so
one can never be taken for the other. Names of the shape before saves were bound to a model
(``loopd-<16 hex>-<32 hex>.bin``, ``SlotFileName.fingerprint`` None) are still read as loopd's,
so that brokerd removes them as it removes any superseded save; loopd never restores one.

brokerd imports this module to refuse every other file name a box asks the server to save or
restore (a path, another client's file, anything the server would resolve outside its folder),
so it depends on the standard library only and does no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

SESSION_HEX = 16
FINGERPRINT_HEX = 12
PREFIX_HEX = 32

# Lower-case hex only, fixed lengths, no separators: the whole name or nothing (fullmatch).
SLOT_FILE_NAME = re.compile(
    rf"loopd-(?P<session>[0-9a-f]{{{SESSION_HEX}}})"
    rf"(?:-(?P<fingerprint>[0-9a-f]{{{FINGERPRINT_HEX}}}))?"
    rf"-(?P<prefix>[0-9a-f]{{{PREFIX_HEX}}})\.bin"
)

_BYTES_TAG = b"loopd-prefix-bytes\0"
_TOKENS_TAG = b"loopd-prefix-tokens\0"


@dataclass(frozen=True)
class SlotFileName:
    """A name of loopd's shape, split into its parts (``fingerprint`` None: a name from before
    saves were bound to a model)."""

    session_tag: str
    fingerprint: str | None
    prefix_digest: str

    @property
    def name(self) -> str:
        model = f"-{self.fingerprint}" if self.fingerprint is not None else ""
        return f"loopd-{self.session_tag}{model}-{self.prefix_digest}.bin"


def session_tag(session: str) -> str:
    """The first part of every file of ``session``."""
    return hashlib.sha256(session.encode("utf-8")).hexdigest()[:SESSION_HEX]


def prefix_digest(prefix: bytes | Sequence[int]) -> str:
    """The second part: a hash of the exact prefix, as bytes or as token ids."""
    digest = hashlib.sha256()
    if isinstance(prefix, bytes | bytearray | memoryview):
        digest.update(_BYTES_TAG)
        digest.update(prefix)
    else:
        digest.update(_TOKENS_TAG)
        for token in prefix:
            if token < 0 or token >= 1 << 32:
                raise ValueError(f"a token id must fit in 32 bits, not {token}")
            digest.update(token.to_bytes(4, "little"))
    return digest.hexdigest()[:PREFIX_HEX]


def slot_file_name(session: str, prefix: bytes | Sequence[int], *, fingerprint: str) -> str:
    """The file that holds ``session``'s state after exactly ``prefix``, as the model of
    ``fingerprint`` (12 lower-case hex) wrote it."""
    if re.fullmatch(rf"[0-9a-f]{{{FINGERPRINT_HEX}}}", fingerprint) is None:
        raise ValueError(f"a fingerprint is {FINGERPRINT_HEX} lower-case hex, not {fingerprint!r}")
    return SlotFileName(session_tag(session), fingerprint, prefix_digest(prefix)).name


def parse_slot_file_name(name: str) -> SlotFileName | None:
    """The parts of a name of loopd's shape; None for anything else."""
    found = SLOT_FILE_NAME.fullmatch(name)
    if found is None:
        return None
    return SlotFileName(found["session"], found["fingerprint"], found["prefix"])


def is_slot_file_name(name: str) -> bool:
    """Whether ``name`` has loopd's shape (and so holds no path, no other client's name)."""
    return parse_slot_file_name(name) is not None


def fingerprint_of(name: str) -> str | None:
    """The fingerprint in a name of loopd's shape; None for any other name, or one from before
    saves were bound to a model."""
    parsed = parse_slot_file_name(name)
    return parsed.fingerprint if parsed is not None else None


def belongs_to(name: str, session: str) -> bool:
    """Whether ``name`` has loopd's shape and is one of ``session``'s files."""
    parsed = parse_slot_file_name(name)
    return parsed is not None and parsed.session_tag == session_tag(session)
