"""What operators see of brokerd: Prometheus metrics, loopd's request ids in its log lines, and
the relay that brings loopd's metrics and status page out of the box.

- ``context``: the socket, request id and session of the request under way (a context variable),
  and the logging filter that adds them to every line;
- ``metrics``: the registry and one method per event;
- ``middleware``: wraps each socket's app: reads loopd's headers (and removes them, so they never
  go upstream), counts requests, statuses and bytes;
- ``relay``: loopd's metrics socket (in a folder the box mounts) read safely from the host;
- ``server``: ``/metrics`` (and ``/loopd/...``, the relay) at ``metrics_addr``.

docs/observability.md describes what an operator gets.
"""
