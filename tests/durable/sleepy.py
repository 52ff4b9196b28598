"""The real router whose model children sleep after a few idle seconds, with a slot-save
folder: what the tests of loopd as a good neighbour run against (``loopd.engine.quiet``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from loopd.engine.client import InferenceClient
from loopd.engine.modelstate import ModelStatus
from loopd_dev import devserver

# How long a state change may take on a loaded machine (waking or loading reads the weights).
CHANGE_WITHIN_S = 120.0


@contextmanager
def sleepy_router(
    workdir: Path, model: str, sleep_s: int, layout: devserver.ServerLayout | None = None
) -> Iterator[devserver.RunningServer]:
    """The router serving ``model``, its children asleep after ``sleep_s`` idle seconds, saving
    slots into ``workdir / "saves"``; stopped at the end, pass or fail."""
    saves = workdir / "saves"
    saves.mkdir(parents=True)
    try:
        server = devserver.start(
            workdir,
            devserver.default_cache_dir(),
            layout=layout,
            extra_args=("--sleep-idle-seconds", str(sleep_s), "--slot-save-path", f"{saves}/"),
            load=(model,),
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server is required and could not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


async def status_becomes(client: InferenceClient, wanted: ModelStatus) -> None:
    """Wait (reading without waking) until the model is ``wanted``."""
    seen = ModelStatus.UNKNOWN
    with anyio.move_on_after(CHANGE_WITHIN_S):
        while (seen := (await client.model_reading()).status) is not wanted:  # noqa: ASYNC110 - polls the server
            await anyio.sleep(0.1)
        return
    pytest.fail(f"the model stayed {seen.value}, never {wanted.value}")
