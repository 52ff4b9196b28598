"""The tool broker's exceptions, all in one tree.

Only ``CatalogueError`` leaves the package (a bad catalogue stops brokerd at startup). The others
are turned into a tool-result text or an HTTP error in one place each (``service``, ``app``), so
the model always gets words it can act on instead of a traceback.
"""

from brokerd.errors import BrokerdError


class BrokerError(BrokerdError):
    """Base of every error the tool broker raises on purpose."""


class CatalogueError(BrokerError):
    """A catalogue file is unreadable or invalid; the message names the file."""


class RequestError(BrokerError):
    """An HTTP request to the broker is malformed (missing field, not JSON): answered with 400."""


class CallConflictError(BrokerError):
    """A call id was reused for a different tool or different arguments: answered with 409."""


class ToolFailure(BrokerError):
    """A tool ran and failed in a way the model should read (refused URL, non-text reply, ...)."""


class ArgvError(BrokerError):
    """Arguments that cannot go into a command's argv (e.g. a value that looks like a flag)."""
