"""loopd's development kit: what the tests, the benchmarks and `make run` need and the product
does not. The fake llama-server and fake Mattermost (first-class, runnable as commands), the
embedded real llama-server (`devserver`) and the session-log benchmark.

It is a distribution of its own (`dev/pyproject.toml`), installed by `make venv` beside loopd and
never part of loopd's wheel.
"""
