"""One self-test run: gather the facts, optionally record them, check them, report.

``run_selftest`` is what ``loopd selftest`` (and ``make verify-device``) runs, and what
``loopd serve`` runs before it starts: a report whose ``exit_status`` is not 0 means refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopd.config import Settings
from loopd.engine.client import InferenceClient
from loopd.engine.quiet import Purpose
from loopd.selftest.checks import (
    CheckResult,
    expectation_from_facts,
    layout_checks,
    passed,
    run_checks,
)
from loopd.selftest.expected import (
    DEFAULT_DIR,
    FieldChange,
    ServerAnswers,
    diff_expectations,
    find_expectation,
    save_expectation,
)
from loopd.selftest.facts import ServerFacts
from loopd.selftest.probe import ProbeConfig, gather_facts
from loopd.selftest.template import TemplateAnswer

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNREACHABLE = 2


@dataclass(frozen=True)
class Recording:
    """What ``--record`` wrote: the file and what changed in it."""

    path: Path
    changes: list[FieldChange]


@dataclass(frozen=True)
class SelftestReport:
    model: str
    url: str
    expectations: Path
    results: list[CheckResult]
    facts: ServerFacts
    recording: Recording | None = None
    notes: list[str] = field(default_factory=list)
    endpoint: str | None = None  # the [[endpoint]] table tested; None: the shorthand's server
    # Why the run could not tell: its layout matched but a probe request failed on the way (the
    # server restarting, 5xx). None when it passed, or failed on what the server answered.
    interrupted: str | None = None

    @property
    def ok(self) -> bool:
        return passed(self.results)

    @property
    def unreachable(self) -> bool:
        return not self.facts.health.reachable

    @property
    def model_away(self) -> str | None:
        """Why the model's facts were not read (not loaded, and nobody waits to load it): no
        verdict on the server, as for one unreachable."""
        return self.facts.model_away

    @property
    def live_skipped(self) -> str | None:
        """Why the live probes did not run (they would wake the model, and nobody waits)."""
        return self.facts.live_skipped

    @property
    def exit_status(self) -> int:
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_PASS if self.ok else EXIT_FAIL

    @property
    def keeps_past_reasoning(self) -> TemplateAnswer:
        probe = self.facts.template
        return probe.keeps_past_reasoning if probe is not None else TemplateAnswer.UNKNOWN

    @property
    def idle_slots_cleared(self) -> bool | None:
        """The pool probe's answer: True on a pool where a slot loses its prompt once another
        slot runs, so sessions should not be pinned (docs/production-shape.md); None when the
        probe did not complete."""
        probe = self.facts.pool
        return probe.cleared if probe is not None else None

    @property
    def durable_available(self) -> bool | None:
        """Whether the probe's slot was saved and restored; None when it did not run."""
        probe = self.facts.durable
        return probe.available if probe is not None else None

    @property
    def answers(self) -> ServerAnswers:
        """What this run found of the server's behaviour (the engine goes by it)."""
        return ServerAnswers(
            self.idle_slots_cleared, self.durable_available, self.keeps_past_reasoning
        )

    def to_json(self) -> dict[str, Any]:
        """The machine-readable report (``loopd selftest --json``)."""
        template = self.facts.template
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "url": self.url,
            "ok": self.ok,
            "exit_status": self.exit_status,
            "expectations": str(self.expectations),
            "checks": [
                {
                    "name": r.name,
                    "ok": r.ok,
                    "informational": r.informational,
                    "expected": r.expected,
                    "actual": r.actual,
                    "detail": r.detail,
                }
                for r in self.results
            ],
            "pool": {"idle_slots_cleared": self.idle_slots_cleared},
            "server_model": self._model_json(),
            "live_skipped": self.live_skipped,
            "durable": {"available": self.durable_available},
            "template": {
                "keeps_past_reasoning": self.keeps_past_reasoning.value,
                "tool_turn_prefix_extension": (
                    template.tool_turn_prefix.value
                    if template is not None
                    else TemplateAnswer.UNKNOWN.value
                ),
            },
            "recorded": None
            if self.recording is None
            else {
                "path": str(self.recording.path),
                "changes": [
                    {"field": c.field, "old": c.old, "new": c.new} for c in self.recording.changes
                ],
            },
            "notes": self.notes,
        }

    def _model_json(self) -> dict[str, Any]:
        """The model's state, idle policy and fingerprint, as read without waking it."""
        reading = self.facts.reading
        router = self.facts.router
        return {
            "status": self.facts.model_status.value,
            "sleep_idle_s": reading.sleep_idle_s if reading is not None else None,
            "router_max_models": router.max_instances if router is not None else None,
            "fingerprint": reading.fingerprint(self.model) if reading is not None else None,
        }


async def run_selftest(
    settings: Settings,
    *,
    model: str | None = None,
    tools_text: str = "",
    record: bool = False,
    expected_dir: Path = DEFAULT_DIR,
    live: bool = True,
    endpoint: str | None = None,
    purpose: Purpose = Purpose.PERSON,
) -> SelftestReport:
    """Probe the server at ``settings.infer_url`` for ``model`` (default ``settings.model``).

    ``endpoint`` names the ``[[endpoint]]`` table the server is (``settings`` then its one-server
    form, ``Settings.for_endpoint``): its expectations are the endpoint's own file, or else the
    model's (``find_expectation``). With ``record``, the expectation file is first rewritten
    from what the server reports now (the endpoint's file, or the model's for the shorthand),
    so the checks then compare against the new values and the live probes still run. Without
    ``live``, only the layout checks run (``layout_checks``: no request reaches a slot).
    ``purpose``: who asks (``loopd.engine.quiet``); where nobody waits, nothing loads the model,
    and the live probes run only on a model awake now (else only the layout checks, with the
    report's ``live_skipped`` saying why).
    Raises ``ExpectationsError`` for an expectations file that cannot be read or written.
    """
    model = model or settings.model
    notes = [] if tools_text else ["no tools file: the render probe rendered without tools"]
    config = ProbeConfig.from_settings(settings, tools_text)

    def connect() -> InferenceClient:
        return InferenceClient(settings.infer_url, model, connect_s=settings.connect_s)

    facts = await gather_facts(connect, config, live=live, purpose=purpose)
    expected, expectations = find_expectation(model, endpoint, expected_dir)
    recording = None
    if record and facts.health.reachable:
        new = expectation_from_facts(facts).model_copy(update={"endpoint": endpoint})
        changes = diff_expectations(expected, new)
        expectations = save_expectation(new, expected_dir)
        recording, expected = Recording(expectations, changes), new
    probed = live and facts.live_skipped is None
    results = run_checks(facts, expected) if probed else layout_checks(facts, expected)
    interrupted = None
    if not passed(results) and passed(layout_checks(facts, expected)):
        interrupted = facts.interrupted
    return SelftestReport(
        model=model,
        url=settings.infer_url,
        expectations=expectations,
        results=results,
        interrupted=interrupted,
        facts=facts,
        recording=recording,
        notes=notes,
        endpoint=endpoint,
    )


def format_report(report: SelftestReport) -> str:
    """The human report: a header, one line per check, the recording's diff, a verdict."""
    where = f"endpoint {report.endpoint}: " if report.endpoint is not None else ""
    lines = [f"loopd selftest: {where}{report.model} at {report.url}"]
    lines.append(f"expectations: {report.expectations}")
    if report.recording is not None:
        lines.append(f"recorded {report.recording.path}:")
        changes = report.recording.changes
        lines.extend(f"  {change.describe()}" for change in changes)
        if not changes:
            lines.append("  no change")
    lines.extend(format_result(result) for result in report.results)
    if report.live_skipped is not None:
        lines.append(f"note: the live probes did not run: {report.live_skipped}")
    if report.model_away is not None:
        lines.append(f"note: {report.model_away}")
    lines.extend(f"note: {note}" for note in report.notes)
    counted = [r for r in report.results if not r.informational]
    good = sum(r.ok for r in counted)
    verdict = "pass" if report.ok else "FAIL"
    lines.append(f"{verdict}: {good} of {len(counted)} checks pass")
    return "\n".join(lines)


def format_result(result: CheckResult) -> str:
    """One line: ``ok   name: expected X, got Y (detail)``; ``info`` lines give the answer."""
    if result.informational:
        best = f" (best: {result.expected})" if result.expected else ""
        text = f"info  {result.name}: {result.actual}{best}"
    else:
        mark = "ok  " if result.ok else "FAIL"
        text = f"{mark}  {result.name}: expected {result.expected}, got {result.actual}"
    if result.detail:
        text = f"{text} ({result.detail})"
    return text
