"""loopd's exception tree, in one place.

Foreign errors (httpx, sqlite3, OS) are translated into these at the boundary where they happen
(``raise ... from exc``), so callers above catch loopd's own types only (``DaemonError``, the
root shared with brokerd, where shared code may raise too). User-facing wording is
decided in one place per surface: the CLI's one-line message, the chat adapter's reply.
"""

from typing import Final

from loopcommon.errors import DaemonError

# The exit status of a command that could not do what was asked (the log cannot be read or has no
# such session, the server cannot be reached, a bad configuration): its one line says why.
EXIT_CANNOT: Final = 2


class LoopdError(DaemonError):
    """Base of every error loopd raises on purpose (its configuration's errors are the shared
    ``loopcommon.errors.ConfigError``)."""


class InferenceError(LoopdError):
    """Talking to llama-server failed."""


class ServerUnreachable(InferenceError):
    """Nothing answers at the configured URL (connection refused, no such socket, DNS)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"llama-server at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


class ServerRejected(InferenceError):
    """The server answered a request with an HTTP error (4xx/5xx) before streaming began."""

    def __init__(self, url: str, status: int, message: str, error_type: str = "") -> None:
        super().__init__(f"llama-server at {url} answered {status}: {message}")
        self.url = url
        self.status = status
        self.message = message
        self.error_type = error_type


class ConnectionDropped(ServerUnreachable):
    """A connection closed before the server answered a request: the request never reached it,
    so one that changes nothing may be sent again."""


class StreamBroken(InferenceError):
    """A stream began but did not complete (silence, error event, disconnect, no [DONE])."""


class StreamCut(StreamBroken):
    """The connection broke while the answer was being read."""


class BrokerCallError(LoopdError):
    """Talking to brokerd's tool broker failed."""


class BrokerUnreachable(BrokerCallError):
    """Nothing answers at the broker's URL: nothing was sent, so nothing ran."""
