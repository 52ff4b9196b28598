"""Task groups wrap what their tasks raise in exception groups; a command line wants the error.

anyio's task groups always raise an ``ExceptionGroup``, even for one failure in one task. Where a
failure is the user's (a bad tools file found while the daemon starts, a socket folder brokerd may
not write), the command line shows its one line, so the group is unwrapped when it holds nothing
but errors of that kind; anything else stays a group, with every traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

E = TypeVar("E", bound=BaseException)


def sole_kind(group: BaseExceptionGroup[Any], kind: type[E]) -> E | None:
    """The first ``kind`` error of ``group`` (nested groups flattened) when every error in it is a
    ``kind``; else None."""
    matched, rest = group.split(kind)
    if matched is None or rest is not None:
        return None
    return next(exc for exc in _leaves(matched) if isinstance(exc, kind))


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
