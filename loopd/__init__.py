"""loopd: the daemon that owns agent sessions against a shared llama-server."""

from loopd import anyio_unix_connect

anyio_unix_connect.apply()
