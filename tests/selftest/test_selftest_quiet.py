"""``loopd serve``'s server watch is a background check (``loopd.engine.quiet``): against the
fake llama-server, a model asleep or not loaded is left so, whether the server matches, the
live probes are owed, or the server changed; the reading goes to the runtime's memory of the
model. The real router's side: ``tests/durable/test_quiet_real.py``."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.config import Settings, load_settings
from loopd.engine.modelstate import Forgot, ModelStatus
from loopd.engine.quiet import Purpose
from loopd.selftest.run import run_selftest
from loopd.serve import ServerWatch
from loopd.sessions import Runtime
from loopd.status.page import snapshot
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, RunningFake, serve_fake_llama

pytestmark = pytest.mark.anyio

MODEL = "fake-model"
# Nothing the watch sends may wait for the model: a request that would wake it blocks on the
# sleeping fake, and this limit fails the test.
CHECK_WITHIN_S = 20.0


@pytest.fixture
def fake() -> FakeLlama:
    return FakeLlama([ModelSpec(MODEL, n_slots=2), ModelSpec("other", n_slots=1)])


@pytest.fixture
async def llama(fake: FakeLlama) -> AsyncIterator[RunningFake]:
    async with serve_fake_llama(fake) as running:
        yield running


def settings_for(tmp_path: Path, llama: RunningFake, **overrides: Any) -> Settings:
    return load_settings(
        infer_url=llama.base_url,
        model=MODEL,
        state_dir=tmp_path / "state",
        slots=(0,),
        connect_s=2.0,
        first_byte_s=10.0,
        silence_s=10.0,
        **overrides,
    )


@asynccontextmanager
async def watching(tmp_path: Path, llama: RunningFake) -> AsyncIterator[ServerWatch]:
    settings = settings_for(tmp_path, llama)
    expected = tmp_path / "expected"
    report = await run_selftest(settings, record=True, expected_dir=expected)
    assert report.ok, [r for r in report.results if not r.ok]
    runtime = Runtime.open(settings)
    try:
        watch = ServerWatch(settings, runtime, expected)
        watch.start(report)
        yield watch
    finally:
        await runtime.aclose()


def asked(fake: FakeLlama, since: int) -> set[str]:
    return {f"{r.method} {r.path}" for r in fake.log[since:]}


QUIET = {"GET /health", "GET /models", "GET /props"}


async def test_an_idle_check_of_a_matching_server_asks_only_what_is_answered_asleep(
    tmp_path: Path, fake: FakeLlama, llama: RunningFake
) -> None:
    async with watching(tmp_path, llama) as watch:
        memory = watch.server.memory
        assert memory.last is not None
        assert memory.last.status is ModelStatus.AWAKE
        fake.faults.set(sleeping=True)
        since = len(fake.log)
        with anyio.fail_after(CHECK_WITHIN_S):
            await watch.check()
        assert asked(fake, since) <= QUIET
        assert watch.server.memory.status is ModelStatus.ASLEEP
        assert watch.server.memory.last_forget is Forgot.SLEPT
        assert watch.change is None
        assert snapshot(watch.runtime).model_state == "asleep"  # the status page says so


async def test_an_unloaded_model_stays_unloaded_and_owes_its_probes(
    tmp_path: Path, fake: FakeLlama, llama: RunningFake
) -> None:
    async with watching(tmp_path, llama) as watch:
        fake.model(MODEL).loaded = False  # evicted by another client's model
        since = len(fake.log)
        with anyio.fail_after(CHECK_WITHIN_S):
            await watch.check()
            await watch.check()
        assert asked(fake, since) <= QUIET
        assert not fake.model(MODEL).loaded
        assert watch.server.memory.last_forget is Forgot.UNLOADED
        assert watch.change is None  # not loaded is no verdict on the server


async def test_a_changed_server_is_found_from_its_layout_while_the_model_sleeps(
    tmp_path: Path, fake: FakeLlama, llama: RunningFake
) -> None:
    async with watching(tmp_path, llama) as watch:
        fake.faults.set(sleeping=True)
        fake.model(MODEL).spec = dataclasses.replace(fake.model(MODEL).spec, n_slots=3)
        since = len(fake.log)
        with anyio.fail_after(CHECK_WITHIN_S):
            await watch.check()  # the quick check fails: the probes are owed, and cannot run
            await watch.check()  # still differs
        assert asked(fake, since) <= QUIET
        assert watch.change is not None
        assert watch.live_due
        # Awake again (a person's turn woke it): the owed probes run, and decide.
        fake.faults.set(sleeping=False)
        with anyio.fail_after(CHECK_WITHIN_S):
            await watch.check()
        assert "POST /v1/chat/completions" in asked(fake, since)
        assert not watch.live_due


async def test_the_startup_self_test_does_not_wake_a_sleeping_model(
    tmp_path: Path, fake: FakeLlama, llama: RunningFake
) -> None:
    settings = settings_for(tmp_path, llama)
    expected = tmp_path / "expected"
    await run_selftest(settings, record=True, expected_dir=expected)
    fake.faults.set(sleeping=True)
    since = len(fake.log)
    with anyio.fail_after(CHECK_WITHIN_S):
        report = await run_selftest(settings, expected_dir=expected, purpose=Purpose.WORK)
    assert asked(fake, since) <= QUIET
    assert report.ok  # the layout checks, all it could run
    assert report.live_skipped == "the model is asleep: background work waits for a person"
    runtime = Runtime.open(settings)
    try:
        watch = ServerWatch(settings, runtime, expected)
        watch.start(report)
        assert watch.live_due
        assert watch.change is None
    finally:
        await runtime.aclose()


async def test_loopd_selftest_run_by_a_person_loads_the_model(
    tmp_path: Path, fake: FakeLlama, llama: RunningFake
) -> None:
    fake.model(MODEL).loaded = False
    report = await run_selftest(settings_for(tmp_path, llama), expected_dir=tmp_path / "x")
    assert fake.model(MODEL).loaded
    assert report.live_skipped is None
    assert report.facts.cache is not None
