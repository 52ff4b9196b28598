"""brokerd: the host-side broker (inference proxy, chat proxy, tool broker)."""
