"""Regular expressions that run in linear time: RE2, for every pattern that comes from outside
(a model's search, a tool schema's ``pattern``). RE2 has no backreferences or lookaround, which is
what lets it promise linear time; a pattern that needs them is refused, never run elsewhere."""

import functools
from typing import Any, Final

import re2

MAX_MEMORY_BYTES: Final = 8 << 20
"""RE2's memory budget for one compiled pattern; a pattern needing more is refused."""

_UNSUPPORTED: Final = {
    "invalid perl operator: (?=": "lookahead is not supported",
    "invalid perl operator: (?!": "lookahead is not supported",
    "invalid perl operator: (?<": "lookbehind is not supported",
}


class RegexError(ValueError):
    """RE2 cannot compile the pattern; the message says why (and which feature, if known)."""


@functools.lru_cache(maxsize=1024)
def compile_linear(pattern: str) -> Any:
    """The pattern compiled by RE2 (cached), or ``RegexError``."""
    options = re2.Options()
    options.max_mem = MAX_MEMORY_BYTES
    options.log_errors = False  # the reason is returned to whoever gave the pattern
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        raise RegexError(_reason(exc.args[0] if exc.args else "")) from None


def _reason(reason: object) -> str:
    why = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    why = why or "it does not compile"
    feature = next((name for key, name in _UNSUPPORTED.items() if why.startswith(key)), None)
    if feature is None and why.startswith("invalid escape sequence: \\") and why[-1:].isdigit():
        feature = "backreferences are not supported"
    return f"{why} ({feature})" if feature else why
