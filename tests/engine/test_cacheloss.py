"""The cache-loss rule: expected reuse after exact replay, and the named causes of a loss."""

from pathlib import Path

from loopd.engine.cacheloss import (
    Circumstances,
    LossCause,
    PrevRequest,
    cache_loss,
    shared_head_bound,
)
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog

# The server's template drops the reasoning of earlier turns from the prompt.
DROPS = Circumstances(template_drops_reasoning=True)


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
    dropped = cache_loss(prev(had_reasoning=True), epoch_id=1, slot=0, cache_n=150, around=DROPS)
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
    # Another session's request (loopd's own, as its log shows) ran on the slot since.
    used = Circumstances(slot_shared=True)
    shared = cache_loss(prev(), epoch_id=1, slot=0, cache_n=0, around=used)
    assert (shared.lost, shared.cause) == (245, LossCause.SHARED_SLOT)
    partly = cache_loss(prev(), epoch_id=1, slot=0, cache_n=150, around=used)
    assert partly.cause is LossCause.SHARED_SLOT
    # No loss, no cause: the host prompt cache gave the slot its prompt back.
    assert cache_loss(prev(), epoch_id=1, slot=0, cache_n=245, around=used).cause is LossCause.NONE
    # A new epoch or another slot is the more certain cause.
    assert cache_loss(prev(), epoch_id=2, slot=0, cache_n=0, around=used).cause is (
        LossCause.NEW_EPOCH
    )


# -- a hybrid model's checkpoints, and requests the server places (docs/production-shape.md) ---


def test_a_loss_back_to_the_checkpoint_before_the_previous_prompts_end_is_named() -> None:
    # The hybrid preset's 10-turn chat: each cache_n was the previous prompt's end less 4.
    before = prev(cache_n=829, prompt_n=50, predicted_n=40)
    loss = cache_loss(before, epoch_id=1, slot=0, cache_n=875)
    assert (loss.expected, loss.lost, loss.cause) == (918, 43, LossCause.CHECKPOINT)
    assert loss.label == "resumed at a checkpoint"
    # The second checkpoint, a micro-batch earlier.
    earlier = cache_loss(before, epoch_id=1, slot=0, cache_n=875 - 512)
    assert (earlier.cause, earlier.at_checkpoint) == (LossCause.CHECKPOINT, True)
    # One token off either is not a checkpoint.
    off = cache_loss(before, epoch_id=1, slot=0, cache_n=874)
    assert (off.cause, off.at_checkpoint) == (LossCause.UNEXPLAINED, False)


def test_a_known_cause_stays_first_with_the_checkpoint_said_beside_it() -> None:
    capped = cache_loss(prev(capped=True), epoch_id=1, slot=0, cache_n=218)
    assert capped.cause is LossCause.CAPPED_TURN
    assert capped.label == "previous turn was capped, resumed at a checkpoint"
    dropped = cache_loss(prev(had_reasoning=True), epoch_id=1, slot=0, cache_n=218, around=DROPS)
    assert dropped.label == "template drops reasoning, resumed at a checkpoint"
    # Not at the checkpoint: the cause alone.
    assert cache_loss(prev(capped=True), epoch_id=1, slot=0, cache_n=150).label == (
        "previous turn was capped"
    )


def test_the_same_prompt_sent_again_may_resume_at_its_checkpoint() -> None:
    broke = prev(complete=False, messages_sha256="same")
    # Expected: the prompt less the token the server re-reads (221); a hybrid resumes at 218.
    resent = cache_loss(broke, epoch_id=1, slot=0, cache_n=218, around=Circumstances(resend=True))
    assert (resent.expected, resent.lost, resent.cause) == (221, 0, LossCause.NONE)
    # Not a resend: the same figures are a loss, with its causes.
    other = cache_loss(broke, epoch_id=1, slot=0, cache_n=218)
    assert (other.lost, other.label) == (3, "previous request broke, resumed at a checkpoint")
    # A resend that lost more than the checkpoint is still a loss.
    worse = cache_loss(broke, epoch_id=1, slot=0, cache_n=100, around=Circumstances(resend=True))
    assert (worse.lost, worse.cause) == (121, LossCause.BROKEN_TURN)


def test_a_loss_is_recorded_only_with_a_cause() -> None:
    noise = cache_loss(prev(), epoch_id=1, slot=0, cache_n=243)
    assert (noise.lost, noise.label) == (0, "")


UNPINNED = Circumstances(pinned=False, shared_head=120)


def test_a_request_the_server_places_has_the_pools_causes() -> None:
    # Nothing came back and no other session ran: the host cache lost it.
    cold = cache_loss(prev(), epoch_id=1, slot=0, cache_n=0, around=UNPINNED)
    assert (cold.lost, cold.cause) == (245, LossCause.NOT_IN_HOST_CACHE)
    # Another session ran meanwhile, and only the shared head came back (or nothing of it).
    others = Circumstances(pinned=False, shared_head=120, other_session_ran=True)
    for kept in (0, 96, 120):
        head = cache_loss(prev(), epoch_id=1, slot=0, cache_n=kept, around=others)
        assert head.cause is LossCause.SHARED_HEAD, kept
    # Within the head, but exactly its own previous prompt's second checkpoint (522 - 4 - 512):
    # its state came back from the host cache.
    own = cache_loss(prev(cache_n=505), epoch_id=1, slot=0, cache_n=6, around=others)
    assert own.cause is LossCause.CHECKPOINT
    # More than the head came back: the session's own part was reused, look further.
    past = cache_loss(prev(capped=True), epoch_id=1, slot=0, cache_n=150, around=others)
    assert past.cause is LossCause.CAPPED_TURN
    # A lane is not a slot: its number says nothing of where the server put the request.
    moved = cache_loss(prev(slot=1), epoch_id=1, slot=0, cache_n=218, around=UNPINNED)
    assert moved.cause is LossCause.CHECKPOINT


def _record(
    epoch: int, cache_n: int | None, prompt_n: int | None, kind: RequestKind
) -> RequestRecord:
    perf = Perf(outcome="complete", cache_n=cache_n, prompt_n=prompt_n, predicted_n=16)
    return RequestRecord(kind, 0, epoch, 2, "", perf)


def test_the_shared_head_is_bounded_by_the_sessions_first_prompt_of_the_epoch(
    tmp_path: Path,
) -> None:
    """Measured on the hybrid preset (the bench's switching section): a 58-byte system text and
    a 175-byte tool rendered to a 370-token head, the template's text around the tools
    included. The session's first prompt held 596 tokens; a later request found only the head
    of another session's prompt in the slot (cache_n 370). A bound of a token per byte of the
    two texts (265 with the template's markers) left that loss unexplained."""
    with SessionLog.open(tmp_path / "log.db") as log:
        log.ensure_session("s", 0)
        for epoch in (1, 2):
            log.start_epoch("s", reason="test", tools_text="[]", system_text="system")
            if epoch == 1:
                log.record_request("s", _record(1, 900, 40, RequestKind.TURN))  # an earlier epoch
        log.record_request("s", _record(2, None, None, RequestKind.TURN))  # broke before timings
        log.record_request("s", _record(2, 0, 8, RequestKind.SELFTEST))  # its own prompt
        log.record_request("s", _record(2, 0, 596, RequestKind.TURN))
        log.record_request("s", _record(2, 592, 54, RequestKind.TURN))
        first = log.latest_request("s", epoch=2, counted=True, first=True)
        head = shared_head_bound(first)
        assert head == 595
        assert shared_head_bound(log.latest_request("s", epoch=3, counted=True, first=True)) == 0
    others = Circumstances(pinned=False, shared_head=head, other_session_ran=True)
    previous = prev(epoch_id=2, cache_n=592, prompt_n=54, predicted_n=16)
    loss = cache_loss(previous, epoch_id=2, slot=0, cache_n=370, around=others)
    assert (loss.lost, loss.cause) == (291, LossCause.SHARED_HEAD)


def test_a_pinned_slot_on_a_pool_that_clears_idle_slots() -> None:
    clears = Circumstances(pool_clears_idle_slots=True, slot_shared=True)
    cleared = cache_loss(prev(), epoch_id=1, slot=0, cache_n=0, around=clears)
    assert cleared.cause is LossCause.SLOT_CLEARED
    # Something kept: the slot was not cleared; another session on it explains the rest.
    partly = cache_loss(prev(), epoch_id=1, slot=0, cache_n=150, around=clears)
    assert partly.cause is LossCause.SHARED_SLOT
    # A server that keeps idle slots: an empty slot is a cold server.
    kept = cache_loss(prev(), epoch_id=1, slot=0, cache_n=0)
    assert kept.cause is LossCause.COLD
