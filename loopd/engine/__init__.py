"""The turn engine: request building, streaming, liveness, runaway control, perf records."""
