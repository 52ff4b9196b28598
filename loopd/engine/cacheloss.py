"""The cache-loss rule: what a request should have reused of its cache, and why not. Pure.

The server reports ``cache_n`` (prompt tokens reused) and ``prompt_n`` (prompt tokens evaluated).
After an exact replay the next request on the same slot should reuse the whole previous prompt and
everything generated after it, less the one token the server always re-evaluates:
``cache_n(k) = cache_n(k-1) + prompt_n(k-1) + predicted_n(k-1) - 1`` (measured by
``tests/contract/test_contract_cache.py::test_b_cache_reuse_over_three_turns_with_tools``; see
docs/contract.md). The gap between that expectation and the real ``cache_n`` is the cache loss; a
known cause is named, and a cold cache is a normal, recorded event, never an error
(``tests/engine/test_turn_fake.py::test_a_cold_server_labels_its_loss``).

A hybrid model (a recurrent state beside the attention layers, production's ``qwen35moe``) cannot
cut its state back to an arbitrary token: a prompt that diverges from what the slot holds resumes
at the latest checkpoint before the divergence, and the server keeps one 4 tokens (and one
4 + ubatch tokens) before the end of every prompt it reads (docs/production-shape.md, "How the
server keeps a session's cache"). Such a loss is said as *resumed at a checkpoint*, beside the
cause of the divergence when one is known (a capped turn, a broken one, dropped reasoning).

Where requests are not pinned to a slot (a unified pool that clears idle slots), the server
places each request and restores it from its host prompt cache; the causes then differ from a
pinned slot's (``Circumstances``).

Where loopd has several servers, each request names its endpoint; a request on another endpoint
than the session's previous one found none of its prompt there, and its loss is ``endpoint lost``
(the session moved off a dead server), whichever request it is: the moved turn's, a prewarm's,
or the first of a later run.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from loopd.engine.durable import RestoreOutcome
from loopd.sessionlog.records import Request

# The server may re-evaluate a token or two at the boundary (a forced re-evaluation of the last
# prompt token, a template joining differently at the end of a turn); losses up to this are noise.
LOSS_TOLERANCE: Final = 2
# A hybrid model's server checkpoints the recurrent state this many tokens before the end of every
# prompt it reads, and again a micro-batch earlier (build 11434's server-context.cpp,
# ``checkpoint_offsets``; docs/production-shape.md). A prompt sent again unchanged must
# re-evaluate its last token, so it resumes at the first of them.
CHECKPOINT_BEFORE_END: Final = 4
# The server's default micro-batch (``--ubatch-size``), the distance to the second checkpoint.
DEFAULT_UBATCH: Final = 512


class LossCause(StrEnum):
    NONE = ""
    FIRST = "first request of the session"
    NEW_EPOCH = "new epoch"
    CAPPED_TURN = "previous turn was capped"
    BROKEN_TURN = "previous request broke"
    TEMPLATE_DROPS_REASONING = "template drops reasoning"
    COLD = "cold server or eviction"
    OTHER_SLOT = "slot changed"
    SHARED_SLOT = "another session used the slot"
    # Pinned requests on a pool that clears idle slots: any other slot's task launch clears it,
    # and a pinned request is not restored from the host cache.
    SLOT_CLEARED = "slot cleared by the unified pool"
    # Unpinned requests: the server would have restored the prompt from its host cache.
    NOT_IN_HOST_CACHE = "not in the host cache (server restarted, model unloaded or evicted)"
    # Unpinned requests: the server placed the request on a slot holding another session's prompt
    # that shares the system text and tools, kept that shared head and did not look in the host
    # cache (docs/production-shape.md, "shared system text").
    SHARED_HEAD = "another session's prompt in the slot: only the shared system text kept"
    CHECKPOINT = "resumed at a checkpoint"
    ENDPOINT_LOST = "endpoint lost"  # its server died; the session moved (loopd.endpoints)
    # Durable sessions (loopd.engine.durable): the server had lost the session and loopd put its
    # saved state back; or tried, and the server refused, or answered and then re-read anyway.
    RESTORED = RestoreOutcome.RESTORED.value
    RESTORE_REFUSED = RestoreOutcome.REFUSED.value
    RESTORE_UNCONFIRMED = RestoreOutcome.UNCONFIRMED.value
    # Durable sessions on, no save to restore, and the pinned slot held nothing at all (cache 0,
    # not even a template's head): a restarted or reloaded server, or one back from its sleep.
    SERVER_RESTARTED = "server restarted"
    # The previous reply, cut at ``max_tokens``, reads back as fewer tokens than the model
    # generated: the server's answer left out some of them (its reasoning parser trims the
    # newline a model writes after ``<think>``, measured on SmolLM2 with the Qwen3.5 template),
    # so the next prompt renders the reply otherwise from its first token and re-reads it.
    REPLY_TRIMMED = "the reply reads back shorter than generated (the server trimmed it)"
    # An answer the previous request read or generated was taken back since (a regenerate): the
    # server's cache past the messages before it is not reused.
    TAKEN_BACK = "an answer was taken back (generated again)"
    UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class PrevRequest:
    """What the cache-loss rule needs from the session's previous request."""

    epoch_id: int
    slot: int
    cache_n: int
    prompt_n: int
    predicted_n: int
    complete: bool
    capped: bool
    had_reasoning: bool
    request_row: int = 0  # its row in the log, to ask what else ran on the slot since
    messages_sha256: str = ""  # what it sent, to recognise the same prompt sent again
    recorded_at: str = ""  # when it was recorded (the log's clock), to ask what came since
    endpoint: str | None = None  # the server it ran on, where loopd has several (loopd.endpoints)
    # Tokens generated that its stored reply lacks (``/tokenize`` of the reply's text against
    # ``predicted_n``), counted for a reply cut at ``max_tokens``; 0: none, or not counted.
    reply_short: int = 0

    @property
    def prompt_end(self) -> int:
        """The tokens of its prompt: where the server last checkpointed a hybrid state."""
        return self.cache_n + self.prompt_n


@dataclass(frozen=True)
class Circumstances:
    """What else the rule knows about the request, besides the previous one."""

    pinned: bool = True  # sent with the session's slot as ``id_slot``; else -1
    # The self-test found that a slot's prompt is cleared once another slot runs (unified pool,
    # ``--cache-idle-slots``): a pinned request there keeps nothing after any other task.
    pool_clears_idle_slots: bool = False
    slot_shared: bool = False  # pinned: another loopd session ran on this slot since
    other_session_ran: bool = False  # unpinned: another loopd session's request ran since
    # At most this many tokens are shared by every session of the epoch (an upper bound: the
    # session's first prompt of the epoch, ``shared_head_bound``).
    shared_head: int = 0
    template_drops_reasoning: bool = False
    resend: bool = False  # the same messages as the previous request, sent again
    # The previous request ran on another of loopd's servers (both named): the session moved,
    # and this server never read its prompt (``loopd.endpoints``). Whatever else happened, that
    # explains the whole loss.
    endpoint_changed: bool = False
    ubatch: int = DEFAULT_UBATCH
    # Durable sessions: on for this request, and what became of a restore made before it.
    durable: bool = False
    restore: RestoreOutcome | None = None
    # An answer was taken back since the previous request (``LossCause.TAKEN_BACK``).
    taken_back: bool = False


@dataclass(frozen=True)
class Loss:
    expected: int
    lost: int
    cause: LossCause
    at_checkpoint: bool = False  # resumed at a hybrid model's checkpoint

    @property
    def label(self) -> str:
        """The cause as recorded: ``at_checkpoint`` said beside a cause it does not replace."""
        if self.at_checkpoint and self.cause not in (LossCause.CHECKPOINT, LossCause.NONE):
            return f"{self.cause.value}, {LossCause.CHECKPOINT.value}"
        return self.cause.value


def endpoint_changed(previous: str | None, now: str | None) -> bool:
    """The request runs on another named endpoint than the previous one (a request of the
    one-server shorthand names none, and then nothing is known to have moved)."""
    return previous is not None and now is not None and previous != now


def previous_request(request: Request | None) -> PrevRequest | None:
    """The cache-loss rule's view of the last request that reached the session's slot: the
    session's latest ``counted`` one (``SessionLog.latest_request``). Self-tests send their own
    prompts, and a request the server never streamed for (a 4xx, a refused connection), or one
    that broke before the server counted a prompt token, left the slot as it was: all are passed
    over by that query.
    """
    perf = None if request is None else request.record.perf
    if request is None or perf is None or perf.cache_n is None or perf.prompt_n is None:
        return None
    record = request.record
    return PrevRequest(
        epoch_id=record.epoch,
        slot=record.slot,
        cache_n=perf.cache_n,
        prompt_n=perf.prompt_n,
        predicted_n=perf.predicted_n or 0,
        complete=perf.outcome == "complete",
        capped=perf.capped,
        had_reasoning=bool(perf.extra.get("had_reasoning")),
        request_row=request.id,
        messages_sha256=record.messages_sha256,
        recorded_at=request.created_at,
        endpoint=perf.extra.get("endpoint"),
        reply_short=_count(perf.extra.get("reply_short")),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def shared_head_bound(first: Request | None) -> int:
    """At most this many tokens begin every prompt of the epoch's sessions alike.

    Every session of the epoch begins with its system text and tools as the template renders
    them, the template's own text around the tools included (on the hybrid preset a 233-byte
    system text and tool came to 370 tokens: the bench's switching section), so the bytes of
    the texts do not bound it. The session's first prompt of the epoch does: that head and at
    least one token of its first message (``first``: the epoch's first ``counted`` request,
    ``SessionLog.latest_request``). 0 while no request of the epoch has timings.
    """
    if first is None:
        return 0
    perf = first.record.perf
    return max((perf.cache_n or 0) + (perf.prompt_n or 0) - 1, 0)


def at_checkpoint(prev: PrevRequest, cache_n: int, ubatch: int = DEFAULT_UBATCH) -> bool:
    """``cache_n`` is where a hybrid model's server checkpointed the previous prompt."""
    end = prev.prompt_end - CHECKPOINT_BEFORE_END
    return cache_n > 0 and cache_n in (end, end - ubatch)


def cache_loss(
    prev: PrevRequest | None,
    *,
    epoch_id: int,
    slot: int,
    cache_n: int,
    around: Circumstances | None = None,
) -> Loss:
    """Expected reuse minus the real ``cache_n``, with the most likely cause.

    The expectation is the same whatever happened in between: the previous request's prompt and
    what it generated, as the server last held them. The cause is what best explains a
    shortfall, the most certain first. ``around``: what else is known of what ran since the
    previous request (none of it: a pinned request with nothing else known).
    """
    around = around or Circumstances()
    if prev is None:
        return Loss(0, 0, LossCause.FIRST)
    expected = prev.cache_n + prev.prompt_n + (prev.predicted_n if prev.complete else 0) - 1
    expected = max(expected, 0)
    lost = max(expected - cache_n, 0)
    checkpoint = at_checkpoint(prev, cache_n, around.ubatch)
    # Noise, and a resend's checkpoint, are recorded as no loss (``expected_reuse`` and
    # ``cache_n`` stay in the record): a loss in the record always has a named cause.
    if around.restore is RestoreOutcome.RESTORED:
        # Named even when nothing was lost: ``loopd perf`` counts the returns a restore made.
        return Loss(expected, lost if lost > LOSS_TOLERANCE else 0, LossCause.RESTORED)
    if lost <= LOSS_TOLERANCE:
        return Loss(expected, 0, LossCause.NONE)
    if around.resend and cache_n >= prev.prompt_end - CHECKPOINT_BEFORE_END:
        # The same prompt again resumes at its checkpoint on a hybrid model: accepted, as the
        # self-test's cache probe accepts it.
        return Loss(expected, 0, LossCause.NONE, at_checkpoint=checkpoint)
    cause = _cause(prev, epoch_id, slot, cache_n, around, checkpoint)
    return Loss(expected, lost, cause, at_checkpoint=checkpoint)


def _cause(
    prev: PrevRequest,
    epoch_id: int,
    slot: int,
    cache_n: int,
    around: Circumstances,
    checkpoint: bool,
) -> LossCause:
    if around.endpoint_changed:
        return LossCause.ENDPOINT_LOST
    if prev.epoch_id != epoch_id:
        return LossCause.NEW_EPOCH
    nothing_kept = cache_n <= LOSS_TOLERANCE
    if around.restore is not None:  # refused or unconfirmed: the re-read that followed
        return LossCause(around.restore.value)
    if around.pinned:
        if prev.slot != slot:
            return LossCause.OTHER_SLOT
        if nothing_kept and around.pool_clears_idle_slots:
            return LossCause.SLOT_CLEARED
        if around.slot_shared:
            return LossCause.SHARED_SLOT
        if around.durable and cache_n == 0:
            return LossCause.SERVER_RESTARTED
        # Nothing reused at all: the server lost the slot's cache (a model unload, a restart, an
        # eviction). A broken or capped turn costs only what follows the previous prompt.
        if nothing_kept:
            return LossCause.COLD
    else:
        # Exactly the previous prompt's checkpoint: the session's own state came back (from the
        # host cache), whatever else ran; the head is only a bound.
        if around.other_session_ran and cache_n <= around.shared_head and not checkpoint:
            return LossCause.SHARED_HEAD
        if nothing_kept:
            return LossCause.NOT_IN_HOST_CACHE
    if around.taken_back:
        return LossCause.TAKEN_BACK
    if not prev.complete:
        return LossCause.BROKEN_TURN
    if prev.capped:
        return LossCause.CAPPED_TURN
    if around.template_drops_reasoning and prev.had_reasoning:
        return LossCause.TEMPLATE_DROPS_REASONING
    if prev.reply_short and cache_n >= prev.prompt_end - CHECKPOINT_BEFORE_END:
        # Its prompt was kept (a hybrid model resumes at its checkpoint before the end), and
        # the reply that follows it reads back otherwise than it was generated.
        return LossCause.REPLY_TRIMMED
    if checkpoint:
        return LossCause.CHECKPOINT
    return LossCause.UNEXPLAINED
