"""The benchmark's own failure: something it needs is missing or a run went wrong."""


class BenchError(RuntimeError):
    """A benchmark could not produce a trustworthy number; the message says why."""
