"""Pin or not (docs/production-shape.md, "Decision"): the self-test's pool answer, the recorded
one, the setting; and where a request then goes."""

from __future__ import annotations

import pytest

from loopd.engine.pinning import PinSlots, choose_slot, decide_pinning
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
    pinning = decide_pinning(setting, selftest=selftest, recorded=recorded)
    assert (pinning.pinned, pinning.idle_slots_cleared) == (pinned, cleared)
    assert pinning.id_slot(2) == (2 if pinned else ANY_SLOT)
    assert pinning.shared_pool is (cleared is True)


def test_the_reason_names_its_source() -> None:
    assert decide_pinning(PinSlots.AUTO, selftest=True, recorded=None).why == (
        "the self-test found idle slots cleared: not pinned"
    )
    assert decide_pinning(PinSlots.AUTO, selftest=None, recorded=False).why == (
        "the recorded expectations found idle slots kept: pinned"
    )
    assert "unknown" in decide_pinning(PinSlots.AUTO, selftest=None, recorded=None).why


def test_a_new_session_gets_the_slot_fewest_sessions_have() -> None:
    assert choose_slot([0, 1, 2], []) == 0
    assert choose_slot([0, 1, 2], [0, 0, 1, 2]) == 1  # a tie goes to the lower id
    # Sessions on slots outside the list (another endpoint's, or one no longer configured).
    assert choose_slot([2, 3], [0, 0, 2, 5]) == 3
