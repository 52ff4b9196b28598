"""The Grafana dashboard in deploy/grafana/: every query is PromQL that promtool parses, and every
metric it and the alert rules name is one that loopd or brokerd exports (read from their own
``/metrics`` text, so a renamed metric breaks this test, not the operator's dashboard)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from brokerd.observe.metrics import BrokerdMetrics
from loopd.config import load_settings
from loopd.observe.metrics import LoopdMetrics
from loopd.sessions import Runtime
from loopd.status.server import create_app

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "loopd-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "loopd-alerts.yml"
METRIC = re.compile(r"\b(?:loopd|brokerd)_[a-z_]+")
SUFFIXES = ("_bucket", "_total", "_count", "_sum")


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


async def exported() -> set[str]:
    runtime = Runtime.open(load_settings(state_dir=Path("/nonexistent/state"), model="m"))
    try:
        app = create_app(runtime, LoopdMetrics())
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as page:
            loopd_text = (await page.get("/metrics")).text
    finally:
        await runtime.aclose()
    brokerd_text = generate_latest(BrokerdMetrics().registry).decode()
    names = set()
    for text in (loopd_text, brokerd_text):
        for found in text_string_to_metric_families(text):
            names.add(family(found.name))
    # Read at scrape time only where they apply: several endpoints, a state folder that exists.
    return names | {"loopd_endpoint_up", "loopd_state_free_bytes", "loopd_state_size_bytes"}


def test_the_dashboard_queries_are_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system-deps` installs it (Debian's prometheus)"
    records = [{"record": f"dashboard:query{i}", "expr": q} for i, q in enumerate(queries())]
    check = tmp_path / "dashboard-queries.yml"
    check.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": records}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(check)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(records)} rules found" in result.stdout


async def test_every_metric_named_is_exported() -> None:
    names = await exported()
    named = {family(m) for text in [*queries(), RULES.read_text()] for m in METRIC.findall(text)}
    assert len(named) > 15  # the dashboard and rules are read
    assert named <= names, sorted(named - names)
