"""Reading a session's prompt into its slot while the server is idle, so that its next turn starts
warm.

``plan`` (pure) keeps which sessions are wanted for a prewarm on which slot; ``prewarmer`` sends
the prewarm (``max_tokens`` 1) when the slot is idle and records it.
"""
