"""The start's self-test of every endpoint: the failing ones are down, with one line each, and
re-checked in the background until they pass."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import anyio
import pytest

from loopd.config import EndpointSettings, load_settings
from loopd.endpoints.health import EndpointHealth
from loopd.endpoints.start import check_all, health_after, recheck_down
from loopd.selftest.checks import CheckResult
from loopd.selftest.endpoints import EndpointCheck, down_line, endpoint_checker, failure_summary
from loopd.selftest.facts import Health, ServerFacts
from loopd.selftest.run import SelftestReport

pytestmark = pytest.mark.anyio

GPU1 = EndpointSettings(name="gpu1", url="unix:/run/loopd/infer-gpu1.sock", model="qwen")
GPU2 = EndpointSettings(name="gpu2", url="http://gpu2:8080", model="qwen")


def report(reachable: bool = True, results: list[CheckResult] | None = None) -> SelftestReport:
    facts = ServerFacts("u", "qwen", (0,), Health(reachable, reachable, "connection refused"))
    return SelftestReport("qwen", "u", Path("e.json"), results or [], facts)


PASSED = report(results=[CheckResult("server", True, "healthy", "healthy")])
UNREACHABLE = report(reachable=False)
MISMATCH = report(
    results=[
        CheckResult("server", True, "healthy", "healthy"),
        CheckResult("context per slot", False, "4096", "8192"),
        CheckResult("slots", False, "2", "4"),
        CheckResult("template keeps past reasoning", False, "yes", "no", informational=True),
    ]
)


def test_a_failure_is_one_line_saying_why_and_what_happens_next() -> None:
    assert failure_summary(UNREACHABLE) == "unreachable (connection refused)"
    assert failure_summary(MISMATCH) == (
        "self-test failed: context per slot: expected 4096, got 8192 (and 1 more failing checks)"
    )
    line = down_line(EndpointCheck(GPU2, UNREACHABLE))
    assert line == (
        "endpoint gpu2 (qwen at http://gpu2:8080) is down: unreachable (connection refused); "
        "re-checked in the background, the other endpoints serve"
    )
    assert "\n" not in line
    assert EndpointCheck(GPU1, None, "e.json: records model 'x'").reason == (
        "e.json: records model 'x'"
    )


async def test_every_endpoint_is_checked_and_the_failing_one_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = {"gpu1": PASSED, "gpu2": UNREACHABLE}

    async def check(endpoint: EndpointSettings) -> EndpointCheck:
        return EndpointCheck(endpoint, answers[endpoint.name])

    with caplog.at_level(logging.INFO, logger="loopd.endpoints.start"):
        checks = await check_all([GPU1, GPU2], check)
        health = health_after(checks, now=10.0)
    assert [(c.endpoint.name, c.ok) for c in checks] == [("gpu1", True), ("gpu2", False)]
    assert health.up() == ("gpu1",)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("self-test passed for endpoint gpu1: qwen at unix:")
    assert messages[1].startswith("endpoint gpu2 (qwen at http://gpu2:8080) is down: unreachable")


async def test_a_down_endpoint_is_rechecked_until_it_passes() -> None:
    health = EndpointHealth(["gpu1", "gpu2"])
    health.mark_down("gpu2", "unreachable", now=0.0)
    answers = iter([UNREACHABLE, UNREACHABLE, PASSED])
    checked: list[str] = []
    back = anyio.Event()

    async def check(endpoint: EndpointSettings) -> EndpointCheck:
        checked.append(endpoint.name)
        return EndpointCheck(endpoint, next(answers))

    # Every reading of this clock is a minute later: each re-check is due at once.
    clock = itertools.count(start=60.0, step=60.0).__next__
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: recheck_down(
                    health, [GPU1, GPU2], check, clock=clock, on_up=lambda check: back.set()
                )
            )
            await back.wait()
            assert checked == ["gpu2", "gpu2", "gpu2"]
            assert health.up() == ("gpu1", "gpu2")
            # Found dead by a request later: the sleeping loop wakes and checks it again.
            answers = iter([PASSED])
            back = anyio.Event()
            health.mark_down("gpu1", "a request found it gone", now=clock())
            await back.wait()
            assert checked[-1] == "gpu1"
            tg.cancel_scope.cancel()


async def test_an_unreachable_endpoint_checked_for_real_is_down(tmp_path: Path) -> None:
    gone = EndpointSettings(name="gone", url=f"unix:{tmp_path}/none.sock", model="m")
    settings = load_settings(endpoint=(gone,), connect_s=1.0)
    result = await endpoint_checker(settings, "", tmp_path)(gone)
    assert not result.ok
    assert result.reason.startswith("unreachable (")
    assert result.report is not None
    assert result.report.endpoint == "gone"
