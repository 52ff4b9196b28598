"""The root of both daemons' exception trees, and the errors the shared package raises.

loopd's tree (``loopd.errors.LoopdError``) and brokerd's (``brokerd.errors.BrokerdError``) both
derive from ``DaemonError``, so a command line catches every error raised on purpose, its own or
the shared package's, with one ``except`` and shows its one line.
"""


class DaemonError(Exception):
    """Base of every error loopd or brokerd raises on purpose."""


class ConfigError(DaemonError):
    """The configuration (environment, TOML file) is invalid; the message names the field."""
