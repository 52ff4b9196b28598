"""A save is bound to the weights that wrote it (``loopd.engine.modelstate.fingerprint``): on
the real router, a session saved under one model file, the server then started with another
file behind the same model id (other weights: a copy of SmolLM2 with bytes of a tensor
changed), and the session's next turn reads its whole prompt instead of restoring the old
weights' state; its save is forgotten, and the self-test reports the new weights as a change
of server. Before saves were bound to a model, that request was recorded "restored from disk"
and took 59 of its 76 prompt tokens from the old weights' state."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from loopd.engine.cacheloss import LossCause
from loopd.engine.durable import DurableMode
from loopd.selftest.run import run_selftest
from loopd.sessionlog.records import RequestKind
from loopd.turn.saves import SaveBook
from loopd_dev import devserver
from tests.durable.test_durable_real import (
    FIRST,
    SECOND,
    SESSION,
    durable_settings,
    runtime_for,
    say,
)
from tests.watch import MIB, Heartbeat, peak_rss

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]

MODEL = "weights-under-test"
# Bytes of the last tensor's data changed, well past the header and the tensor table.
CHANGED_BYTES = 4096


def weights_file(folder: Path, name: str, *, changed: bool) -> Path:
    """A copy of SmolLM2's file; ``changed``: with bytes of its last tensor changed (other
    weights of the same shape)."""
    source = devserver.Provisioned.in_cache(devserver.default_cache_dir()).model
    target = folder / name
    shutil.copyfile(source, target)
    if changed:
        with target.open("r+b") as file:
            file.seek(-CHANGED_BYTES, 2)
            data = bytearray(file.read(CHANGED_BYTES))
            file.seek(-CHANGED_BYTES, 2)
            file.write(bytes(b ^ 0x5A for b in data))
    return target


class Server:
    """The router serving ``MODEL`` from a file of the test's, with a slot-save folder."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.saves = workdir / "saves"
        self.saves.mkdir(parents=True)
        self.model = MODEL
        self.running: devserver.RunningServer | None = None

    @property
    def url(self) -> str:
        return f"unix:{self.workdir / 'llama.sock'}"

    def start(self, weights: Path) -> None:
        preset = devserver.Preset(
            MODEL, (("model", str(weights)), ("c", "8192"), ("np", "2"), ("kv-unified", "false"))
        )
        try:
            self.running = devserver.start(
                self.workdir,
                devserver.default_cache_dir(),
                socket_path=self.workdir / "llama.sock",
                extra_args=("--slot-save-path", f"{self.saves}/"),
                presets=(preset,),
                load=(MODEL,),
            )
        except devserver.DevServerError as exc:
            pytest.fail(f"the real llama-server is required and could not start: {exc}")

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    made = Server(tmp_path / "server")
    try:
        yield made
    finally:
        made.stop()


async def test_a_save_is_never_restored_into_other_weights_behind_the_same_model_id(
    server: Server, tmp_path: Path
) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    server.start(weights_file(weights, "model-v1.gguf", changed=False))
    settings = durable_settings(server, tmp_path / "state", DurableMode.ON)
    expected = tmp_path / "expected"
    recorded = await run_selftest(settings, record=True, expected_dir=expected)
    assert recorded.ok, [r for r in recorded.results if not r.ok]
    async with runtime_for(settings) as runtime:
        await say(runtime, FIRST)
        saved = SaveBook(settings.state_dir).latest(SESSION)
        assert saved is not None, "the answered turn was saved"
        assert saved.fingerprint is not None
        server.stop()
        server.start(weights_file(weights, "model-v2.gguf", changed=True))
        beat = Heartbeat()  # the turn on the new weights, watched
        async with anyio.create_task_group() as beating:
            await beating.start(beat.run)
            second = await say(runtime, SECOND)
            beating.cancel_scope.cancel()
    # The self-test reports the new weights as a change of server.
    changed = await run_selftest(settings, expected_dir=expected)
    assert [r.name for r in changed.results if not r.ok] == ["model weights"]
    answered = next(
        r.record.perf
        for r in second
        if r.record.kind is RequestKind.TURN and r.record.perf.outcome == "complete"
    )
    assert "restore" not in answered.extra, answered.extra
    assert answered.cache_loss_cause != LossCause.RESTORED.value
    assert answered.cache_n == 0, "the whole prompt is read again on the new weights"
    new_save = SaveBook(settings.state_dir).latest(SESSION)
    assert new_save is not None
    assert new_save.fingerprint not in (None, saved.fingerprint)
    print(
        f"other weights behind {MODEL}: {answered.prompt_n} prompt tokens read, none restored; "
        f"peak RSS {peak_rss() / MIB:.0f} MiB (the test's process), longest event-loop stall "
        f"{beat.longest_stall_s * 1000:.0f} ms"
    )
