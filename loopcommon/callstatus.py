"""A tool call's status, as brokerd records and answers it and loopd counts it in its metrics."""

from typing import Final, Literal, get_args

CallStatus = Literal["ok", "refused", "invalid", "error", "timeout", "replayed", "interrupted"]
CALL_STATUSES: Final[frozenset[str]] = frozenset(get_args(CallStatus))
