"""Findings (i), (j), (k), (l), (m): what a stream shows, and when it shows nothing."""

from __future__ import annotations

import itertools
import time
from typing import Any

import anyio
import pytest

from loopd.wire import ReasoningDelta, StreamEvent, Timings
from tests.contract.conftest import Record
from tests.contract.contract_kit import (
    Endpoint,
    Message,
    Streamed,
    Target,
    carried_forward,
    chat_body,
    complete,
    cost,
    hybrid_resume_point,
    is_processing,
    stream,
)

pytestmark = pytest.mark.anyio


def endless(target: Target) -> dict[str, Any]:
    """Long enough that a blocker is still generating when the test hangs it up: the hybrid
    model writes a few thousand tokens a second, so it gets nearly its whole context."""
    return {"max_tokens": 16000 if target.hybrid else 2000, "ignore_eos": True}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


async def tokens_in(endpoint: Endpoint, text: str) -> int:
    async with endpoint.client() as client:
        tokens = await client.post_json("/tokenize", {"model": endpoint.model, "content": text}, 30)
    return len(tokens["tokens"])


async def wait_until_processing(endpoint: Endpoint, slot: int, want: bool = True) -> float:
    """Poll /slots until the slot's is_processing is ``want``; the seconds it took."""
    started = time.monotonic()
    with anyio.fail_after(60):
        while await is_processing(endpoint, slot) is not want:  # noqa: ASYNC110 - polls the server
            await anyio.sleep(0.02)
    return time.monotonic() - started


async def test_i_progress_events_break_the_prefill_silence(target: Target, record: Record) -> None:
    """With return_progress a long prefill reports every batch; without it the stream is silent
    from the status line until the first token."""
    # The hybrid model reads a few thousand tokens a second: a prompt as short as SmolLM2's is
    # read in about 40 ms, within the noise of the timings compared below. 1,600 words are about
    # 7,000 of its tokens, well inside its pool.
    words = " ".join(f"entry{i}" for i in range(1600 if target.hybrid else 220))
    loud = await complete(
        target.keep, [user("Log A. " + words)], id_slot=0, max_tokens=1, return_progress=True
    )
    quiet = await complete(target.keep, [user("Log B. " + words)], id_slot=0, max_tokens=1)

    prefill_s = loud.timings.prompt_ms / 1000
    assert len(loud.progress) >= 4, "a prefill of several batches reported progress per batch"
    assert loud.progress[-1].processed == loud.progress[-1].total
    assert loud.headers_at is not None
    first_token_at = loud.data_at[len(loud.progress)]
    instants = [loud.headers_at, *loud.progress_at, first_token_at]
    longest = max(b - a for a, b in itertools.pairwise(instants))
    assert longest < 0.6 * prefill_s, f"silence of {longest:.2f} s in a {prefill_s:.2f} s prefill"

    assert not quiet.progress
    assert quiet.headers_at is not None
    silence = quiet.data_at[0] - quiet.headers_at
    assert silence >= 0.8 * quiet.timings.prompt_ms / 1000
    record(
        "i",
        target.kind,
        f"{len(loud.progress)} progress events over a {loud.timings.prompt_n}-token prefill "
        f"({prefill_s:.2f} s), longest gap {longest:.2f} s; without: {silence:.2f} s silent",
        progress_events=len(loud.progress),
        longest_gap_s=round(longest, 3),
        silent_s=round(silence, 3),
    )


async def test_j_pinned_request_to_a_busy_slot_gets_no_bytes_until_it_frees(
    target: Target, record: Record
) -> None:
    """Nothing, not even the status line, while queued; /slots shows the slot busy meanwhile."""
    endpoint, slot, hold_s = target.plain, 1, 1.0
    hang_up = anyio.Event()
    released_at: list[float] = []
    queued_headers_at: list[float] = []
    queued: list[Streamed] = []
    blocker = chat_body(
        endpoint, [user("Count upwards from one.")], id_slot=slot, **endless(target)
    )

    async def run_blocker() -> None:
        await stream(endpoint, blocker, stop_when=lambda out, event: hang_up.is_set())
        released_at.append(time.monotonic())

    async def run_queued() -> None:
        body = chat_body(endpoint, [user("Say hi.")], id_slot=slot, max_tokens=4)
        queued.append(
            await stream(
                endpoint, body, on_headers=lambda: queued_headers_at.append(time.monotonic())
            )
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_blocker)
        await wait_until_processing(endpoint, slot)
        tg.start_soon(run_queued)
        await anyio.sleep(hold_s)  # the silence under test: real time, by nature
        busy_while_queued = await is_processing(endpoint, slot)
        bytes_while_queued = bool(queued_headers_at)
        hang_up.set()

    assert not bytes_while_queued, "the queued request received bytes before its slot freed"
    assert busy_while_queued, "/slots did not show the slot processing"
    assert queued[0].assembler.done
    wait_s = queued_headers_at[0] - released_at[0]
    assert wait_s > -0.05, "the status line came before the blocker let go"
    record(
        "j",
        target.kind,
        f"no bytes for {hold_s:.1f} s while queued, /slots is_processing true; "
        f"status line {max(wait_s, 0):.2f} s after the slot freed",
        status_after_release_s=round(wait_s, 3),
    )


async def test_l_closing_the_stream_frees_the_slot_within_a_second(
    target: Target, record: Record
) -> None:
    endpoint, slot = target.plain, 0
    body = chat_body(
        endpoint,
        [user("Tell me a long story.")],
        id_slot=slot,
        timings_per_token=True,
        **endless(target),
    )

    def after_three_tokens(out: Streamed, event: StreamEvent) -> bool:
        return isinstance(event, Timings) and event.predicted_n >= 3

    closed = await stream(endpoint, body, stop_when=after_three_tokens)
    freed_s = await wait_until_processing(endpoint, slot, want=False)
    assert closed.closed_early
    assert freed_s < 1.5, f"the slot was still busy {freed_s:.2f} s after the client hung up"
    record("l", target.kind, f"slot idle {freed_s:.2f} s after closing", freed_s=round(freed_s, 3))


async def test_m_per_token_predicted_n_counts_real_tokens(target: Target, record: Record) -> None:
    """With timings_per_token every token's chunk carries predicted_n, and the final count is
    the number of tokens the answer tokenizes to (plus the end-of-turn token)."""
    endpoint = target.plain
    result = await complete(
        endpoint, [user("Name three animals.")], id_slot=0, max_tokens=12, timings_per_token=True
    )
    counts = [t.predicted_n for t in result.per_token]
    assert len(counts) >= 3
    assert counts == sorted(counts), "predicted_n went backwards"
    assert counts[-1] == result.timings.predicted_n
    async with endpoint.client() as client:
        answer = await client.post_json(
            "/tokenize", {"model": endpoint.model, "content": result.assembler.content}, 30
        )
    predicted = result.timings.predicted_n
    if target.hybrid:
        # The random model writes tokens no tokenizer would put side by side, so its answer
        # tokenized back is other tokens (BPE merges across their boundaries): the count is
        # checked chunk by chunk instead, one token each.
        assert counts[:predicted] == list(range(1, predicted + 1)), counts
    else:
        extra = predicted - len(answer["tokens"])
        assert extra in (0, 1), f"predicted_n {predicted}, answer {answer}"
    record(
        "m",
        target.kind,
        f"predicted_n {counts[0]}..{counts[-1]} over {len(counts)} chunks; "
        f"answer tokenizes to {len(answer['tokens'])} (finish {result.assembler.finish_reason})",
        counts=counts,
    )


async def test_k_control_call_ends_thinking_and_costs_one_turn(
    target: Target, record: Record
) -> None:
    """success: true while thinking and the turn ends normally; success: false for an unknown
    or finished id; the next turn re-reads at most the capped turn."""
    endpoint, slot = target.keep, 1
    messages: list[Message] = [user("Think it through: what is 17 + 23 - 9?")]
    answers: list[dict[str, Any]] = []
    reasoning_at_control: list[int] = []

    async def end_thinking_after_five(out: Streamed, event: StreamEvent) -> None:
        pieces = out.assembler.reasoning
        if answers or not isinstance(event, ReasoningDelta) or len(out.per_token) < 5:
            return
        reasoning_at_control.append(len(pieces))
        assert out.assembler.completion_id is not None
        async with endpoint.client() as client:
            answers.append(await client.control_reasoning_end(out.assembler.completion_id))

    body = chat_body(
        endpoint,
        messages,
        id_slot=slot,
        # The call's room is counted in tokens, not in how fast it arrives: the end of text is
        # ignored, so the completion runs to max_tokens, and a call sent after five tokens of
        # reasoning finds it running however late it lands within them. (48 tokens, ended by
        # the model, were written before the call arrived on a loaded machine: "no active
        # completion for this id".) The hybrid model writes a few thousand tokens a second.
        max_tokens=6000 if target.hybrid else 512,
        ignore_eos=True,
        reasoning_control=True,
        timings_per_token=True,
    )
    capped = await stream(endpoint, body, watch=end_thinking_after_five)
    assert answers == [{"success": True}]
    assert capped.assembler.done
    assert capped.assembler.finish_reason == "length"
    reasoning_after = len(capped.assembler.reasoning) - reasoning_at_control[0]
    async with endpoint.client() as client:
        finished = await client.control_reasoning_end(capped.assembler.completion_id or "")
        unknown = await client.control_reasoning_end("chatcmpl-" + "0" * 32)
    assert finished["success"] is False
    assert unknown["success"] is False

    messages += [capped.replay(), user("And plus one?")]
    following = await complete(endpoint, messages, id_slot=slot, max_tokens=4)
    prompt_before = capped.timings.cache_n + capped.timings.prompt_n
    kept_at_least = hybrid_resume_point(capped) if target.hybrid else prompt_before - 1
    assert following.timings.cache_n >= kept_at_least, "more than the capped turn was re-read"
    reread = carried_forward(capped) - following.timings.cache_n
    # The capped turn as the next prompt holds it: on the hybrid model its random tokens,
    # replayed as text, tokenize to other tokens, more of them than it wrote.
    capped_turn = (
        await tokens_in(endpoint, capped.assembler.reasoning + capped.assembler.content)
        if target.hybrid
        else capped.timings.predicted_n
    )
    assert following.timings.prompt_n <= capped_turn + 40
    record(
        "k",
        target.kind,
        f"success true; {reasoning_after} reasoning chars after the call; finish "
        f"{capped.assembler.finish_reason}; unknown/finished id success false; next turn "
        f"cache_n {following.timings.cache_n} prompt_n {following.timings.prompt_n} "
        f"({reread} tokens of the capped turn re-read)",
        next_turn=cost(following),
        capped=cost(capped),
        reread=reread,
    )
