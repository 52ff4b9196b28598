"""loopd: the daemon that owns agent sessions against a shared llama-server."""
