"""Pin or not (docs/production-shape.md, "Decision"): the self-test's pool answer, the recorded
one, the setting; and where a request then goes."""

from __future__ import annotations

import pytest

from loopd.engine.placement import PinSlots, decide_placement
from loopd.engine.request import ANY_SLOT


@pytest.mark.parametrize(
    ("setting", "selftest", "recorded", "pinned", "cleared"),
    [
        # auto: the self-test's answer first, then the recorded one, else not pinned.
        (PinSlots.AUTO, True, None, False, True),
        (PinSlots.AUTO, False, None, True, False),
        (PinSlots.AUTO, False, True, True, False),  # the live answer wins over the record
        (PinSlots.AUTO, None, True, False, True),
        (PinSlots.AUTO, None, False, True, False),
        (PinSlots.AUTO, None, None, False, None),
        # yes / no: as the operator says, whatever the pool.
        (PinSlots.YES, True, None, True, True),
        (PinSlots.YES, None, None, True, None),
        (PinSlots.NO, False, None, False, False),
    ],
)
def test_pinning_follows_the_pool_answer_unless_the_operator_says(
    setting: PinSlots,
    selftest: bool | None,
    recorded: bool | None,
    pinned: bool,
    cleared: bool | None,
) -> None:
    placement = decide_placement(setting, selftest=selftest, recorded=recorded)
    assert (placement.pinned, placement.idle_slots_cleared) == (pinned, cleared)
    assert placement.id_slot(2) == (2 if pinned else ANY_SLOT)
    assert placement.shared_pool is (cleared is True)


def test_the_reason_names_its_source() -> None:
    assert decide_placement(PinSlots.AUTO, selftest=True, recorded=None).why == (
        "the self-test found idle slots cleared: not pinned"
    )
    assert decide_placement(PinSlots.AUTO, selftest=None, recorded=False).why == (
        "the recorded expectations found idle slots kept: pinned"
    )
    assert "unknown" in decide_placement(PinSlots.AUTO, selftest=None, recorded=None).why
