"""The cache-loss rule: expected reuse after exact replay, and the named causes of a loss."""

from loopd.engine.perf import LossCause, PrevRequest, cache_loss


def prev(**overrides: object) -> PrevRequest:
    fields: dict[str, object] = {
        "epoch_id": 1,
        "slot": 0,
        "cache_n": 205,
        "prompt_n": 17,
        "predicted_n": 24,
        "complete": True,
        "capped": False,
        "had_reasoning": False,
    }
    fields.update(overrides)
    return PrevRequest(**fields)  # type: ignore[arg-type]


def test_exact_replay_has_no_loss() -> None:
    # Figures of a real exact replay: turn 2 cache_n 205 / prompt_n 17 / predicted_n 24 -> turn 3
    # cache_n 245 (the rule is measured by tests/contract/test_contract_cache.py)
    loss = cache_loss(prev(), epoch_id=1, slot=0, cache_n=245)
    assert (loss.expected, loss.lost, loss.cause) == (245, 0, LossCause.NONE)


def test_first_request_and_new_epoch_and_slot_change() -> None:
    assert cache_loss(None, epoch_id=1, slot=0, cache_n=0).cause is LossCause.FIRST
    assert cache_loss(prev(), epoch_id=2, slot=0, cache_n=0).cause is LossCause.NEW_EPOCH
    assert cache_loss(prev(), epoch_id=1, slot=1, cache_n=0).cause is LossCause.OTHER_SLOT


def test_causes_in_order_of_certainty() -> None:
    assert cache_loss(prev(capped=True), epoch_id=1, slot=0, cache_n=85).cause is (
        LossCause.CAPPED_TURN
    )
    assert cache_loss(prev(), epoch_id=1, slot=0, cache_n=0).cause is LossCause.COLD
    dropped = cache_loss(
        prev(had_reasoning=True), epoch_id=1, slot=0, cache_n=150, template_drops_reasoning=True
    )
    assert dropped.cause is LossCause.TEMPLATE_DROPS_REASONING
    assert dropped.lost == 95
    assert cache_loss(prev(), epoch_id=1, slot=0, cache_n=150).cause is LossCause.UNEXPLAINED


def test_broken_previous_request_expects_only_its_prompt() -> None:
    loss = cache_loss(prev(complete=False), epoch_id=1, slot=0, cache_n=221)
    assert (loss.expected, loss.lost) == (221, 0)
    broken = cache_loss(prev(complete=False), epoch_id=1, slot=0, cache_n=100)
    assert broken.cause is LossCause.BROKEN_TURN


def test_small_boundary_losses_are_noise() -> None:
    assert cache_loss(prev(), epoch_id=1, slot=0, cache_n=243).cause is LossCause.NONE


def test_another_session_on_the_slot_explains_a_loss_before_a_cold_server() -> None:
    shared = cache_loss(prev(), epoch_id=1, slot=0, cache_n=0, slot_shared=True)
    assert (shared.lost, shared.cause) == (245, LossCause.SHARED_SLOT)
    partly = cache_loss(prev(), epoch_id=1, slot=0, cache_n=150, slot_shared=True)
    assert partly.cause is LossCause.SHARED_SLOT
    # No loss, no cause: the host prompt cache gave the slot its prompt back.
    assert cache_loss(prev(), epoch_id=1, slot=0, cache_n=245, slot_shared=True).cause is (
        LossCause.NONE
    )
    # A new epoch or another slot is the more certain cause.
    assert cache_loss(prev(), epoch_id=2, slot=0, cache_n=0, slot_shared=True).cause is (
        LossCause.NEW_EPOCH
    )
