"""What operators see of loopd: Prometheus metrics, request ids in the logs, the status page.

- ``metrics``: the registry and one method per event (the engine's hooks call them);
- ``context``: the request id of the model request or tool call under way, in the logs and in the
  headers loopd sends to brokerd;
- ``live``: the turns under way and their phase, for the status page;
- ``toolcalls``: the scope of one tool call (its id, its log line, its metrics);
- ``status``: the status page, rendered from a snapshot (pure);
- ``server``: ``/metrics`` and the status page on ``LOOPD_METRICS_ADDR``.

docs/observability.md describes what an operator gets.
"""
