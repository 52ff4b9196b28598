"""The contract suite's fixtures: ``target`` runs each test on the real server, on the hybrid
server (production's layout) and on the fake.

Measured numbers go to the file named by ``LOOPDTEST_CONTRACT_RESULTS`` (JSON) when it is set;
``tests/contract/write_table.py`` turns that file into docs/contract.md's table.

``LOOPDTEST_CONTRACT_FAKE_FAULTS=byte_while_queued`` (comma-separated fault switches) runs the
fake with those switches on, to show which contract test catches a fake that lies.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopd_dev import devserver
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, TemplateOptions, serve_fake_llama
from tests.contract.contract_kit import Endpoint, Target

# Not LOOPD_*: loopd refuses a LOOPD_ variable that names no setting.
RESULTS_ENV = "LOOPDTEST_CONTRACT_RESULTS"
FAKE_FAULTS_ENV = "LOOPDTEST_CONTRACT_FAKE_FAULTS"
# A small batch, so a prefill the tiny model gets through quickly still spans several batches
# (progress is reported once per batch; the default batch is 2048 tokens).
SMALL_BATCH_ARGS = ("-b", "128", "-ub", "128")
FAKE_PLAIN, FAKE_KEEP, FAKE_DROP = "smollm2", "smollm2-keep", "smollm2-think"
# The hybrid server's three templates over the same tiny qwen35moe model: the devserver's
# production-shaped preset keeps every turn's reasoning; ChatML does not think; llama.cpp's
# Qwen3.5 template drops reasoning before the last user message.
HYBRID_KEEP = devserver.HYBRID_MODEL
HYBRID_PLAIN, HYBRID_DROP = f"{HYBRID_KEEP}-chatml", f"{HYBRID_KEEP}-think"

Record = Callable[..., None]


def keep_template(workdir: Path) -> Path:
    """The devserver's every-turn-reasoning template (Qwen3.5's with one condition changed, as
    the production template renders every turn's reasoning), written into ``workdir``."""
    prov = devserver.Provisioned.in_cache(devserver.default_cache_dir())
    original = (prov.templates / devserver.THINKING_TEMPLATE).read_text(encoding="utf-8")
    path = workdir / "keep-reasoning.jinja"
    path.write_text(devserver.every_turn_reasoning(original), encoding="utf-8")
    return path


def start_own_server(workdir: Path, *, models_max: int = 2) -> devserver.RunningServer:
    """A router of the contract suite's own, with the keep-reasoning template on every model."""
    try:
        template = keep_template(workdir)
        return devserver.start(
            workdir,
            devserver.default_cache_dir(),
            socket_path=workdir / "llama.sock",
            layout=devserver.ServerLayout(models_max=models_max),
            extra_args=("--chat-template-file", str(template), *SMALL_BATCH_ARGS),
            load=(devserver.PLAIN_MODEL,),
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the contract suite's own llama-server could not start: {exc}")


def hybrid_presets() -> tuple[devserver.Preset, ...]:
    prov = devserver.Provisioned.in_cache(devserver.default_cache_dir())
    return (
        devserver.hybrid_preset(
            prov, None, name=HYBRID_PLAIN, extra=(("chat-template", "chatml"),)
        ),
        devserver.hybrid_preset(
            prov, prov.templates / devserver.THINKING_TEMPLATE, name=HYBRID_DROP
        ),
    )


def start_hybrid_server(workdir: Path, *, models_max: int = 3) -> devserver.RunningServer:
    """A router of the suite's own serving the hybrid presets on production's layout (four
    slots, one unified pool, host prompt cache, ``--cache-idle-slots`` as by default)."""
    try:
        return devserver.start(
            workdir,
            devserver.default_cache_dir(),
            socket_path=workdir / "llama.sock",
            layout=devserver.ServerLayout(models_max=models_max),
            extra_args=SMALL_BATCH_ARGS,
            presets=hybrid_presets(),
            # Loaded before the tests: /slots answers 400 for a model not loaded yet.
            load=(HYBRID_KEEP, HYBRID_PLAIN, HYBRID_DROP)[:models_max],
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the contract suite's hybrid llama-server could not start: {exc}")


@pytest.fixture(scope="session")
def hybrid_server() -> Iterator[devserver.RunningServer]:
    with tempfile.TemporaryDirectory(prefix="lh") as tmp:
        server = start_hybrid_server(Path(tmp))
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def keep_server() -> Iterator[devserver.RunningServer]:
    with tempfile.TemporaryDirectory(prefix="lk") as tmp:
        server = start_own_server(Path(tmp))
        try:
            yield server
        finally:
            server.stop()


def fake_llama(**kwargs: Any) -> FakeLlama:
    """The fake, shaped like the real router: the same slots and context, a realistic pace."""
    return FakeLlama(
        [
            ModelSpec(FAKE_PLAIN, n_slots=2, n_ctx=4096, template=TemplateOptions(thinking=False)),
            ModelSpec(FAKE_KEEP, n_slots=2, n_ctx=4096),
            ModelSpec(
                FAKE_DROP, n_slots=2, n_ctx=4096, template=TemplateOptions(drop_past_reasoning=True)
            ),
        ],
        pace=Pace(tokens_per_second=200, prompt_tokens_per_second=4000, batch_size=128),
        **kwargs,
    )


REAL_KINDS = [
    pytest.param("real", marks=pytest.mark.real_server),
    pytest.param("hybrid", marks=pytest.mark.real_server),
]


@pytest.fixture(params=[*REAL_KINDS, "fake"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    if request.param == "hybrid":
        hybrid: devserver.RunningServer = request.getfixturevalue("hybrid_server")
        yield Target(
            "hybrid",
            plain=Endpoint(hybrid.url, HYBRID_PLAIN),
            keep=Endpoint(hybrid.url, HYBRID_KEEP),
            drop=Endpoint(hybrid.url, HYBRID_DROP),
        )
        return
    if request.param == "real":
        real: devserver.RunningServer = request.getfixturevalue("real_server")
        keep: devserver.RunningServer = request.getfixturevalue("keep_server")
        yield Target(
            "real",
            plain=Endpoint(real.url, devserver.PLAIN_MODEL),
            keep=Endpoint(keep.url, devserver.PLAIN_MODEL),
            drop=Endpoint(real.url, devserver.THINKING_MODEL),
        )
        return
    fake = fake_llama()
    switches = [name for name in os.environ.get(FAKE_FAULTS_ENV, "").split(",") if name]
    fake.faults.set(**dict.fromkeys(switches, True))
    with tempfile.TemporaryDirectory(prefix="lf") as tmp:
        uds = Path(tmp) / "llama.sock"
        async with serve_fake_llama(fake, uds=uds):
            url = f"unix:{uds}"
            yield Target(
                "fake",
                plain=Endpoint(url, FAKE_PLAIN),
                keep=Endpoint(url, FAKE_KEEP),
                drop=Endpoint(url, FAKE_DROP),
                fake=fake,
            )


@pytest.fixture(scope="session")
def contract_results() -> Iterator[dict[str, Any]]:
    results: dict[str, Any] = {}
    yield results
    path = os.environ.get(RESULTS_ENV)
    if path and results:
        old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        for finding, by_kind in results.items():
            old.setdefault(finding, {}).update(by_kind)
        Path(path).write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def record(request: pytest.FixtureRequest, contract_results: dict[str, Any]) -> Record:
    """``record(finding, kind, summary, **numbers)``: what this test measured, for the table."""
    test_name = request.node.originalname

    def save(finding: str, kind: str, summary: str, **numbers: Any) -> None:
        entry = {"test": test_name, "summary": summary, "numbers": numbers}
        contract_results.setdefault(finding, {})[kind] = entry

    return save
