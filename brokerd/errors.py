"""brokerd's exception tree: every error it raises on purpose derives from ``BrokerdError``.

Its root is the one both daemons share (``loopcommon.errors.DaemonError``), so brokerd's command
line shows one line for its own errors and for the shared package's (a bad config file).
"""

from loopcommon.errors import DaemonError


class BrokerdError(DaemonError):
    """Base of every error brokerd raises on purpose."""


class ServeError(BrokerdError):
    """brokerd cannot start serving (a socket folder it cannot make or write, a socket path taken
    by something else, a bind failure)."""
