"""Several llama-servers: which one each session's turn runs on, and which are up.

``placement`` (pure) chooses an endpoint for a new session and keeps a placed session on its own
while that is up; ``health`` (pure) holds each endpoint's up or down state and when a down one is
checked again. The engine's own rule (``loopd.engine``) then chooses the slot or lane within the
endpoint.
"""
