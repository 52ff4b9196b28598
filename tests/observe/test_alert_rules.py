"""The alert rules shipped in deploy/prometheus/: checked by promtool, and evaluated by promtool's
rule tests against scrapes of loopd's own ``/metrics`` page, once in trouble (each rule fires)
and once healthy (none does); and the two rules for a daemon that is down, on the ``up`` series
Prometheus writes for each scrape of the two jobs docs/observability.md configures.

A scrape is one moment; the rule tests need series over time. Each scraped sample becomes a series
of the same value every minute for 40 minutes (a counter climbs from 0 to its scraped value at an
even pace), which is what the rules' ``for:`` durations and ``increase()`` windows read.
"""

from __future__ import annotations

import json  # promtool reads YAML, and JSON is YAML
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loopd.config import load_settings
from loopd.observe.metrics import LoopdMetrics
from loopd.selftest.checks import CheckResult
from loopd.serverchange import server_change
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord
from loopd.sessions import Runtime
from loopd.status.server import create_app

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "loopd-alerts.yml"
MINUTES = 40
LOOPD_ALERTS = (
    "LoopdTurnStuck",
    "LoopdServerChanged",
    "LoopdEndpointDown",
    "LoopdStateDiskFilling",
    "LoopdAnswersCut",
    "LoopdMattermostDisconnected",
)
# What each alert says, for the trouble the test makes.
SAID = {
    "LoopdTurnStuck": "a loopd turn has run for 2h 0m 0s",
    "LoopdServerChanged": "the server differs from loopd's recorded expectations; threads wait",
    "LoopdEndpointDown": "endpoint gpu2 is down; its sessions moved to the others",
    "LoopdStateDiskFilling": "2% of the state disk is free",
    "LoopdAnswersCut": "66.67% of answers were cut at max_tokens",
    "LoopdMattermostDisconnected": "loopd has had no WebSocket to Mattermost for 10 minutes",
}
TWO_ENDPOINTS = """
[[endpoint]]
name = "gpu1"
url = "http://127.0.0.1:9/"
model = "m"

[[endpoint]]
name = "gpu2"
url = "http://127.0.0.1:9/"
model = "m"
"""


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make system-deps` installs it (Debian's prometheus)"
    return found


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


@contextmanager
def runtime_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    config = tmp_path / "loopd.toml"
    config.write_text(TWO_ENDPOINTS)
    monkeypatch.setenv("LOOPD_CONFIG", str(config))
    yield Runtime.open(load_settings(state_dir=tmp_path / "state"))


def turn_record(*, cut: bool) -> RequestRecord:
    extra = {"finish_reason": "length" if cut else "stop"}
    return RequestRecord(RequestKind.TURN, 0, 1, 2, "0" * 64, Perf(predicted_n=9, extra=extra))


async def scrape(runtime: Runtime, metrics: LoopdMetrics, *, ahead_s: float = 0.0) -> str:
    app = create_app(runtime, metrics, clock=lambda: time.time() + ahead_s)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as page:
        answer = await page.get("/metrics")
    assert answer.status_code == 200
    return answer.text


def input_series(text: str, *, scale: dict[str, float] | None = None) -> list[dict[str, str]]:
    """The scrape's samples as promtool input series over ``MINUTES`` minutes."""
    series = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = sample.value * (scale or {}).get(sample.name, 1.0)
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            if family.type == "counter":
                values = f"0+{value / MINUTES}x{MINUTES}"
            else:
                values = f"{value}+0x{MINUTES}"
            series.append({"series": f"{sample.name}{{{labels}}}", "values": values})
    return series


def rule_test(tmp_path: Path, series: list[dict[str, str]], firing: set[str]) -> str:
    """The loopd alerts on ``series``: those in ``firing`` fire, with their labels and words."""
    expected = {name: (_labels(name), SAID[name]) for name in LOOPD_ALERTS}
    return promtool_test(tmp_path, series, expected, firing)


def promtool_test(
    tmp_path: Path,
    series: list[dict[str, str]],
    expected: dict[str, tuple[dict[str, str], str]],
    firing: set[str],
) -> str:
    """promtool's rule test at ``MINUTES`` minutes: each alert of ``expected`` (its labels and
    summary) fires if in ``firing``, and is silent otherwise."""
    tests: list[dict[str, Any]] = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": f"{MINUTES}m",
                    "alertname": name,
                    "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": said}}]
                    if name in firing
                    else [],
                }
                for name, (labels, said) in expected.items()
            ],
        }
    ]
    path = tmp_path / "rules_test.yml"
    path.write_text(json.dumps({"rule_files": [str(RULES)], "tests": tests}))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _labels(alert: str) -> dict[str, str]:
    severity = {
        "LoopdServerChanged": "critical",
        "LoopdStateDiskFilling": "critical",
        "LoopdAnswersCut": "info",
    }.get(alert, "warning")
    return {"severity": severity, **({"endpoint": "gpu2"} if alert == "LoopdEndpointDown" else {})}


async def test_each_rule_fires_on_a_loopd_in_trouble(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = LoopdMetrics()
    with runtime_at(tmp_path, monkeypatch) as runtime:
        try:
            assert runtime.endpoints is not None
            runtime.endpoints.fleet.health.mark_down("gpu2", "unreachable", time.monotonic())
            runtime.server_change = server_change(
                [CheckResult("build", False, expected="11434", actual="11500")]
            )
            for cut in (True, True, False):  # two answers of three cut at max_tokens
                metrics.request_recorded(turn_record(cut=cut))
            metrics.mattermost_connected(False)
            with runtime.live.turn("mm:stuck", 0, lambda _: None, lambda _: None):
                text = await scrape(runtime, metrics, ahead_s=2 * 3600)  # begun 2 hours ago
        finally:
            await runtime.aclose()
    assert 'loopd_endpoint_up{endpoint="gpu2"} 0.0' in text
    # The one step that is not loopd's own: the state's disk is made 98 % full in the series
    # (the test cannot fill this machine's disk), from the free bytes loopd reported.
    size = next(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "loopd_state_size_bytes"
    )
    free = next(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "loopd_state_free_bytes"
    )
    series = input_series(text, scale={"loopd_state_free_bytes": 0.02 * size / free})
    assert "SUCCESS" in rule_test(tmp_path, series, set(LOOPD_ALERTS))


async def test_no_rule_fires_on_a_healthy_loopd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = LoopdMetrics()
    with runtime_at(tmp_path, monkeypatch) as runtime:
        try:
            for _ in range(9):
                metrics.request_recorded(turn_record(cut=False))
            metrics.request_recorded(turn_record(cut=True))  # one in ten: below the rule's 25 %
            metrics.mattermost_connected(True)
            with runtime.live.turn("mm:busy", 0, lambda _: None, lambda _: None):
                text = await scrape(runtime, metrics, ahead_s=60)  # a turn a minute old
        finally:
            await runtime.aclose()
    free = [line for line in text.splitlines() if line.startswith("loopd_state_free_bytes")]
    assert free, "the scrape reports the state's free bytes"
    assert "SUCCESS" in rule_test(tmp_path, input_series(text), set())


DOWN_ALERTS = {
    "LoopdDown": "loopd's metrics cannot be read: loopd is down (threads get no answer)",
    "BrokerdDown": "brokerd is down: loopd reaches neither the model nor Mattermost",
}
RELAY = "127.0.0.1:9464"  # both jobs scrape brokerd's address (loopd's page through its relay)


def up_series(*, loopd: int, brokerd: int) -> list[dict[str, str]]:
    """Prometheus's ``up`` of each job, the same at every scrape for ``MINUTES`` minutes."""
    return [
        {"series": f'up{{instance="{RELAY}",job="{job}"}}', "values": f"{value}+0x{MINUTES}"}
        for job, value in (("loopd", loopd), ("brokerd", brokerd))
    ]


def down_labels(job: str) -> dict[str, str]:
    return {"severity": "critical", "instance": RELAY, "job": job}


@pytest.mark.parametrize(
    ("loopd", "brokerd", "firing"),
    [
        (1, 1, set()),
        (0, 1, {"LoopdDown"}),
        # brokerd down: loopd's page cannot be read either, and one alert says what to fix.
        (0, 0, {"BrokerdDown"}),
    ],
)
def test_a_daemon_that_is_down_fires_its_rule(
    tmp_path: Path, loopd: int, brokerd: int, firing: set[str]
) -> None:
    expected = {
        "LoopdDown": (down_labels("loopd"), DOWN_ALERTS["LoopdDown"]),
        "BrokerdDown": (down_labels("brokerd"), DOWN_ALERTS["BrokerdDown"]),
    }
    series = up_series(loopd=loopd, brokerd=brokerd)
    assert "SUCCESS" in promtool_test(tmp_path, series, expected, firing)
