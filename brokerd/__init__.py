"""brokerd: the host-side broker (inference proxy, chat proxy, tool broker)."""

from loopd import anyio_unix_connect

anyio_unix_connect.apply()
