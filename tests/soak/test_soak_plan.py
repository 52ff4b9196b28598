"""The soak's plan: one seed, one plan; every fault kind in it, inside the load."""

from __future__ import annotations

from soak.plan import FaultKind, Place, Style, fault_window, make_plan


def test_a_seed_gives_one_plan_and_another_seed_another() -> None:
    assert make_plan(5, 600, 40) == make_plan(5, 600, 40)
    assert make_plan(5, 600, 40).faults != make_plan(6, 600, 40).faults


def test_every_fault_kind_is_planned_even_in_a_short_run() -> None:
    for seconds in (60.0, 600.0):
        plan = make_plan(11, seconds, 10)
        assert {f.kind for f in plan.faults} == set(FaultKind)
        low, high = (seconds * share for share in fault_window(seconds))
        assert all(low <= f.at_s <= high for f in plan.faults)
        assert [f.at_s for f in plan.faults] == sorted(f.at_s for f in plan.faults)
    assert len(make_plan(11, 600, 40).faults) == 30
    # A long run begins with a calm: the turns without faults to compare with.
    assert min(f.at_s for f in make_plan(11, 600, 40).faults) >= 120.0


def test_threads_spread_over_places_and_styles() -> None:
    plan = make_plan(3, 600, 40)
    assert len(plan.threads) == 40
    assert {t.place for t in plan.threads} == set(Place)
    assert {t.style for t in plan.threads} == set(Style)
    assert sum(t.style is Style.TOOLS for t in plan.threads) == 16
    # Each user has at most two threads: loopd lets one person wait in three at once.
    per_user = [sum(t.user == u for t in plan.threads) for u in plan.users]
    assert max(per_user) == 2
