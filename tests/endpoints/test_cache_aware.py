"""What each endpoint's cache holds breaks placement's ties, and a request on another endpoint
than the session's previous one is labelled ``endpoint lost`` by the cache-loss rule itself."""

from loopd.endpoints.fleet import Fleet
from loopd.endpoints.placement import Move
from loopd.engine.cacheloss import (
    Circumstances,
    LossCause,
    PrevRequest,
    cache_loss,
    endpoint_changed,
)


def test_a_tie_goes_to_the_endpoint_whose_cache_holds_the_shared_head() -> None:
    fleet = Fleet(["gpu1", "gpu2"], clock=lambda: 0.0)
    assert fleet.place("a") == Move("gpu1")  # nothing known: the configured order
    assert fleet.place("b") == Move("gpu2")
    fleet.holds_head("gpu2", 370)
    assert fleet.place("c") == Move("gpu2")  # a tie (one session each): gpu2 holds the head
    assert fleet.place("d") == Move("gpu1")  # the load still comes first


def test_a_server_that_died_holds_nothing_until_a_session_reads_there_again() -> None:
    fleet = Fleet(["gpu1", "gpu2"], clock=lambda: 0.0)
    fleet.holds_head("gpu1", 370)
    fleet.holds_head("gpu2", 370)
    fleet.health.mark_down("gpu1", "unreachable", now=0.0)
    fleet.health.mark_up("gpu1")
    assert [load.shared_tokens for load in fleet.loads()] == [0, 370]
    assert fleet.place("a") == Move("gpu2")


PREV = PrevRequest(
    epoch_id=1,
    slot=0,
    cache_n=0,
    prompt_n=400,
    predicted_n=20,
    complete=True,
    capped=False,
    had_reasoning=False,
    endpoint="a",
)


def test_a_request_on_another_endpoint_is_endpoint_lost_whatever_else_happened() -> None:
    moved = Circumstances(endpoint_changed=endpoint_changed("a", "b"), slot_shared=True)
    loss = cache_loss(PREV, epoch_id=1, slot=1, cache_n=0, around=moved)
    assert (loss.lost, loss.cause) == (419, LossCause.ENDPOINT_LOST)
    # The same loss on the same endpoint is the slot's.
    stayed = Circumstances(endpoint_changed=endpoint_changed("a", "a"))
    assert cache_loss(PREV, epoch_id=1, slot=1, cache_n=0, around=stayed).cause is (
        LossCause.OTHER_SLOT
    )
    # A moved prompt that the new endpoint held after all (it served the session before) lost
    # nothing, and is labelled so.
    kept = cache_loss(PREV, epoch_id=1, slot=0, cache_n=419, around=moved)
    assert (kept.lost, kept.cause) == (0, LossCause.NONE)


def test_the_one_server_shorthand_names_no_endpoint_and_nothing_moved() -> None:
    assert not endpoint_changed(None, "a")
    assert not endpoint_changed("a", None)
    assert endpoint_changed("a", "b")
