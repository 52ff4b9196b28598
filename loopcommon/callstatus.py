"""A tool call's status, as brokerd records and answers it and loopd counts it in its metrics."""

from typing import Final, Literal, get_args

# "needs_approval": refused until a person decides (never recorded as a call's end); "denied":
# a person (or the approval's time limit) refused it.
CallStatus = Literal[
    "ok",
    "refused",
    "invalid",
    "error",
    "timeout",
    "replayed",
    "interrupted",
    "needs_approval",
    "denied",
]
CALL_STATUSES: Final[frozenset[str]] = frozenset(get_args(CallStatus))
