"""The run's verdict and its last line: what ``make soak`` exits by and what the short run in the
test suite reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.machine import Machine
from soak.chaos import Injected
from soak.plan import FaultKind
from soak.report import Figures, render
from tests.soak.test_soak_short import FIGURES

MACHINE = Machine(cpu_model="a test CPU", cores=2, memory_gib=4.0, python="3.11", system="Linux")


def passing() -> Figures:
    return Figures(
        command="python -m soak --seconds 60 --threads 10",
        seed=7,
        seconds=60.0,
        threads=10,
        machine=MACHINE,
        load_before="0.1 / 0.1 / 0.1",
        load_after="0.2 / 0.2 / 0.2",
        messages=30,
        answers=12,
        stops=1,
        errors=1,
        tool_calls=60,
        tools_started=60,
        verify="ok",
        verify_ok=True,
        faults=[Injected(kind, 1.0, fired=True) for kind in FaultKind],
        drained=True,
        settle_s=(42.0, 600.0),
    )


def test_a_run_that_broke_nothing_passes_and_its_last_line_gives_the_figures() -> None:
    figures = passing()
    assert figures.failures() == []
    match = FIGURES.match(figures.last_line())
    assert match is not None, figures.last_line()
    assert match["verdict"] == "PASS"
    assert (match["lost"], match["twice"], match["tools_twice"]) == ("0", "0", "0")
    assert (match["turns"], match["faults"], match["calls"]) == ("14", str(len(FaultKind)), "60")
    report = render(figures, "soak.png")
    assert "**Result: PASS**" in report
    assert "settled in 42 s" in report
    assert "make soak" in report.partition("## How to run it")[2]


def _few_tools(f: Figures) -> None:
    f.tool_calls = f.tools_started = 49


def _a_fault_never_fired(f: Figures) -> None:
    f.faults[0].fired = False


def _unsettled(f: Figures) -> None:
    f.drained = False


def _verify_failed(f: Figures) -> None:
    f.verify_ok = False


BREAKS: dict[str, Callable[[Figures], object]] = {
    "lost": lambda f: f.lost.append("p1 (t00): never stored"),
    "answered twice": lambda f: f.answered_twice.append("k1 posted twice"),
    "tool twice": lambda f: f.tools_twice.append("t01m1-1 ran 2 times"),
    "unsettled": _unsettled,
    "few tools": _few_tools,
    "a fault never fired": _a_fault_never_fired,
    "verify": _verify_failed,
}


@pytest.mark.parametrize("name", BREAKS)
def test_each_broken_invariant_fails_the_run(name: str) -> None:
    figures = passing()
    BREAKS[name](figures)
    assert figures.failures()
    assert figures.last_line().startswith("soak FAIL: ")
    assert "**Result: FAIL**" in render(figures, "soak.png")
