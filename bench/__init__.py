"""``make bench``: loopd measured against a naive client on the real llama-server, and its own cost.

Benchmarks are not timed tests: ``python -m bench`` runs them and writes a report to
``bench/results/<date>.md`` with a plot; ``make test`` never depends on a timing. ``tests/bench``
checks the bench code itself (parsers agree, the naive client renders as documented, the
report holds what it must), never how fast anything is.
"""
