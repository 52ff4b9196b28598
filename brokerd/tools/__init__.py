"""The tool broker: a catalogue of tools beyond the model's core set, reached by ``find_tool`` and
run by ``call_tool`` with validation, limits, an append-only audit log and idempotency.

Layout: a pure core (``catalogue`` parsing, ``ranking``, ``arguments``, ``wording``,
``idempotency``, ``capture``) and a thin I/O shell (``audit`` for SQLite, ``execute`` and
``builtins`` for subprocesses and HTTP, ``service`` tying them together, ``app`` for the routes).
"""
