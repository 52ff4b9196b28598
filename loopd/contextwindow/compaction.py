"""Compaction: when a session's prompt nears its slot's context, it goes on in a new epoch.

The new epoch holds the same tools bytes and system text, a summary of the old epoch written by
the model, the latest user message(s), and, when the compaction comes in the middle of a turn,
that turn's tool rounds as they are (the calls and their results: summarised, they would be made
again). The old epoch stays in the log as it was. It costs one
full read: the compaction request itself extends the cached prompt (only the instruction is new),
and the new epoch's first request reads the new, short prompt.

The instruction is appended to the old epoch as a user entry before the compaction request is
sent, and the summary as the assistant entry it answered. So the compaction request is an ordinary
replaying request (``loopd log verify`` checks it like any other, with no special case), the log
says exactly what the model was asked, and a crash between the steps is resumed from the rows: an
instruction without an answer is sent again; an answer without a new epoch is used as it is.

When the model cannot write a summary (the request broke, it answered with tool calls only, or
the compaction request itself would not fit), the new epoch starts from a plain excerpt of the
last messages instead: a compaction never fails a turn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from loopd.contextwindow import pool
from loopd.contextwindow.budget import (
    MESSAGE_OVERHEAD,
    BudgetRules,
    BudgetVerdict,
    Cut,
    ServerBudget,
    estimate_prompt,
    fit_input,
    input_cap,
    judge,
    upper_bound_tokens,
)
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.outcome import RequestResult, TurnOutcome
from loopd.engine.progress import Phase, Status, StatusCallback
from loopd.engine.request import RequestSettings, build_body
from loopd.errors import InferenceError
from loopd.sessionlog.assistant import tool_calls_of
from loopd.sessionlog.records import (
    REPLAYED_KINDS,
    Entry,
    EntryKind,
    Epoch,
    Request,
    RequestKind,
)
from loopd.sessionlog.store import SessionLog

log = logging.getLogger(__name__)

INSTRUCTION = (
    "[loopd] This conversation is about to be compacted to fit the model's context. Write a "
    "summary of the session so far that you can continue from: what the user wants, the "
    "decisions made, the files touched, the open questions, and the last tool results that "
    "matter. Plain text only; do not call tools."
)
# The instruction's tokens, bounded for any tokenizer of English text (real ones average about
# four characters a token; the byte count would overstate it fourfold and shrink the input cap).
INSTRUCTION_TOKENS = len(INSTRUCTION) // 2 + MESSAGE_OVERHEAD
# External keys of the entries compaction appends; user posts never have these prefixes.
INSTRUCTION_KEY = "loopd-compaction"
SUMMARY_KEY = "loopd-summary"
CARRY_KEY = "loopd-carry"
_OWN_KEYS = (INSTRUCTION_KEY + ":", SUMMARY_KEY + ":")
# The plain excerpt used when there is no summary: this many last messages, each this long.
EXCERPT_MESSAGES = 6
EXCERPT_CHARS = 300
_TURN_KINDS = frozenset({RequestKind.TURN, RequestKind.TOOL_FOLLOWUP})


# -- pure ----------------------------------------------------------------------------------------


def instruction_key(session: str, epoch: int) -> str:
    return f"{INSTRUCTION_KEY}:{session}:{epoch}"


def summary_key(session: str, epoch: int) -> str:
    return f"{SUMMARY_KEY}:{session}:{epoch}"


def carry_key(session: str, epoch: int, index: int) -> str:
    return f"{CARRY_KEY}:{session}:{epoch}:{index}"


def is_own_entry(entry: Entry) -> bool:
    """An instruction or a summary that compaction appended (not something the user wrote)."""
    return (entry.fields.external_key or "").startswith(_OWN_KEYS)


def is_compaction_instruction(entry: Entry) -> bool:
    """The user entry that asked the model for an epoch's summary (the next answer is it)."""
    key = entry.fields.external_key or ""
    return entry.kind is EntryKind.USER and key.startswith(INSTRUCTION_KEY + ":")


def user_text(entry: Entry) -> str:
    """The content of a stored user message."""
    content = json.loads(entry.message or "{}").get("content")
    return content if isinstance(content, str) else ""


def latest_user_block(entries: Sequence[Entry]) -> list[Entry]:
    """The user messages the current turn answers: the last run of consecutive user entries
    among the replayed ones, compaction's own entries left out."""
    replayed = [e for e in entries if e.kind in REPLAYED_KINDS and not is_own_entry(e)]
    block: list[Entry] = []
    for entry in reversed(replayed):
        if entry.kind is EntryKind.USER:
            block.append(entry)
        elif block:
            break
    return block[::-1]


def tool_rounds_under_way(entries: Sequence[Entry], block: Sequence[Entry]) -> list[Entry]:
    """The tool rounds of the turn under way: the assistant entries with tool calls, and the
    results, that follow the latest user block (none when the turn has answered). A new epoch
    carries them as they are: summarised, they are calls the model would make again."""
    if not block:
        return []
    rounds: list[Entry] = []
    for entry in entries:
        if entry.seq <= block[-1].seq or entry.kind not in (EntryKind.ASSISTANT, EntryKind.TOOL):
            continue
        if is_own_entry(entry) or _answers(entry):
            break  # the compaction's own summary, or the turn's answer: no round under way
        rounds.append(entry)
    return rounds


def _answers(entry: Entry) -> bool:
    if entry.kind is not EntryKind.ASSISTANT:
        return False
    return not tool_calls_of(entry.message or "")


def asked_at(entries: Sequence[Entry], session: str, epoch: int) -> int | None:
    """The seq of the epoch's compaction instruction, if one was appended."""
    key = instruction_key(session, epoch)
    return next((e.seq for e in entries if e.fields.external_key == key), None)


def written_summary(entries: Sequence[Entry], session: str, epoch: int) -> str | None:
    """The summary already in the epoch: the assistant entry after its instruction ("" when it
    holds no text); None when none was written (or asked for)."""
    asked = asked_at(entries, session, epoch)
    if asked is None:
        return None
    for entry in entries:
        if entry.seq > asked and entry.kind is EntryKind.ASSISTANT and entry.message:
            content = json.loads(entry.message).get("content")
            return content.strip() if isinstance(content, str) and content.strip() else ""
    return None


def summary_message(summary: str, old_epoch: int) -> str:
    return (
        f"[loopd] The conversation so far (epoch {old_epoch}) was compacted into this summary "
        f"to fit the model's context.\n\n{summary}"
    )


def excerpt_summary(entries: Sequence[Entry]) -> str:
    """A plain excerpt of the last messages, for when the model wrote no summary."""
    lines: list[str] = []
    for entry in entries:
        if entry.kind not in (EntryKind.USER, EntryKind.ASSISTANT, EntryKind.TOOL):
            continue
        key = entry.fields.external_key or ""
        if key.startswith(INSTRUCTION_KEY + ":") or not entry.message:
            continue
        message = json.loads(entry.message)
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = tool_calls_of(entry.message) if entry.kind is EntryKind.ASSISTANT else ()
        if not text and calls:
            text = "(called " + ", ".join(call.name for call in calls) + ")"
        text = " ".join(text.split())
        if len(text) > EXCERPT_CHARS:
            text = text[:EXCERPT_CHARS] + "…"
        lines.append(f"- {entry.kind.value}: {text}")
    if not lines:
        return "(There was no earlier conversation to summarise.)"
    shown = lines[-EXCERPT_MESSAGES:]
    return "No summary could be written. The last messages were:\n" + "\n".join(shown)


def notice(old_epoch: int, new_epoch: int) -> str:
    return (
        f"(The conversation was compacted to fit the model's context: epoch {new_epoch} goes on "
        f"from a summary of epoch {old_epoch}.)"
    )


def known_size(request: Request, messages: Sequence[str]) -> tuple[int, list[str]]:
    """The tokens the server held after ``request`` and the messages appended since.

    A complete turn request left its prompt and answer in the slot, and its answer is the next
    stored message; a prewarm generated a token that is not stored; a broken one kept no answer.
    """
    record, perf = request.record, request.record.perf
    total = (perf.cache_n or 0) + (perf.prompt_n or 0)
    after = record.message_count
    if perf.outcome == "complete" and record.kind is not RequestKind.PREWARM:
        total += perf.predicted_n or 0
        after += 1
    return total, list(messages[after:])


@dataclass(frozen=True)
class Size:
    tokens: int
    exact: bool


# -- I/O -----------------------------------------------------------------------------------------


class Attempted(Protocol):
    """A request the turn sent and recorded (``loopd.turn.loop.Attempt``)."""

    @property
    def result(self) -> RequestResult: ...


class Summariser(Protocol):
    """The turn, as the request that asks for a summary."""

    async def request(self, kind: RequestKind, outcome: TurnOutcome) -> Attempted: ...


class CompactedTurn(Protocol):
    """What compaction reads of the turn it keeps inside its context (``loopd.turn.loop.Turn``,
    the layer above: it passes itself to its gate)."""

    @property
    def session(self) -> str: ...

    @property
    def log(self) -> SessionLog: ...

    @property
    def client(self) -> InferenceClient: ...

    @property
    def settings(self) -> RequestSettings: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def report(self) -> StatusCallback: ...

    def summariser(
        self, report: StatusCallback, *, max_tokens: int, think_cap: int
    ) -> Summariser: ...


@dataclass
class Compactor:
    """The turn's context gate: measures each request before it is sent and compacts first when
    it would not fit, and cuts over-long tool results."""

    budget: ServerBudget
    rules: BudgetRules = field(default_factory=BudgetRules)

    async def fit_input(self, text: str, what: str) -> str:
        return (await self.fit(text, what)).text

    async def fit(self, text: str, what: str, kept_in: str | None = None) -> Cut:
        """``text`` whole, or cut to what one input may take with a note saying so (naming
        ``kept_in``, the workspace's file that keeps it whole, if any)."""
        try:
            cap = await self.cap()
        except InferenceError as exc:
            log.warning("the context is unknown (%s); %s is kept whole", exc, what)
            return Cut(text, 0, was_cut=False)
        if upper_bound_tokens(text) <= cap:  # no need to count
            return Cut(text, 0, was_cut=False, cap=cap)
        try:
            cut = await fit_input(text, cap, self.budget.count_text, what, kept_in)
        except InferenceError as exc:
            log.warning("/tokenize failed (%s); %s is cut by its byte length", exc, what)
            cut = await fit_input(text, cap, _byte_count, what, kept_in)
        if cut.was_cut:
            log.info("%s cut from %d tokens to fit %d", what, cut.original_tokens, cap)
        return cut

    async def cap(self) -> int:
        n_ctx = await self.budget.n_ctx()
        return input_cap(n_ctx, self.rules, INSTRUCTION_TOKENS)

    async def before_request(
        self, turn: CompactedTurn, kind: RequestKind, outcome: TurnOutcome
    ) -> None:
        """Compact first when the next request would not fit (see ``budget``); on a shared
        pool, then wait while it would not fit beside the requests running (``pool``)."""
        epoch = turn.log.current_epoch(turn.session)
        entries = _epoch_entries(turn, epoch)
        try:
            plan = await self._plan(turn, kind, epoch, entries)
        except InferenceError as exc:
            # The request itself will meet the same server and report what is wrong with it.
            log.warning("the prompt of %s could not be measured (%s)", turn.session, exc)
            return
        if plan is not None:
            size, why = plan
            epoch = await self.compact(turn, outcome, epoch, entries, size=size, why=why)
        if self.budget.shared:
            await self.room_in_pool(turn, epoch)

    async def room_in_pool(self, turn: CompactedTurn, epoch: Epoch) -> None:
        """Wait (shown as queued) while the prompt and its answer's room would not fit in what
        the busy slots leave of the pool; at most the first-byte limit, then send anyway."""
        try:
            n_ctx, whole = await self.budget.n_ctx(), await self.budget.pool()
        except InferenceError:
            return  # the request itself meets the server and says what is wrong
        needed = (await self.size(turn, epoch)).tokens + self.rules.answer_room(n_ctx)
        needed += self.rules.margin
        if needed > whole:
            return  # an upper bound past the whole pool: waiting could not help
        fits = await pool.wait_for(
            turn.client,
            lambda slots: pool.fits_beside(needed, whole, slots),
            limit_s=turn.limits.first_byte_s,
            poll_s=turn.limits.slots_poll_s,
            on_wait=lambda: turn.report(Status(Phase.QUEUED)),
        )
        if not fits:
            log.warning("%s: the shared pool stayed full; sending anyway", turn.session)

    async def _plan(
        self, turn: CompactedTurn, kind: RequestKind, epoch: Epoch, entries: list[Entry]
    ) -> tuple[int, str] | None:
        """(prompt size, why) when the session must compact now; None when it fits."""
        n_ctx = await self.budget.n_ctx()
        if asked_at(entries, turn.session, epoch.number) is not None:
            # A compaction was cut short (by a crash or a stop): finish it first.
            return await self._count_exactly(turn, epoch), "resumed after an interruption"
        turn_start = kind is RequestKind.TURN
        size = await self.size(turn, epoch)
        verdict = judge(size.tokens, n_ctx, self.rules, turn_start=turn_start, exact=size.exact)
        if verdict is BudgetVerdict.COUNT_EXACTLY:
            size = Size(await self._count_exactly(turn, epoch), exact=True)
            verdict = judge(size.tokens, n_ctx, self.rules, turn_start=turn_start, exact=True)
        if verdict is not BudgetVerdict.COMPACT:
            return None
        has_turns = turn.log.latest_request(turn.session, epoch=epoch.number, kinds=_TURN_KINDS)
        if (
            has_turns is None
            and size.tokens + self.rules.answer_room(n_ctx) + self.rules.margin <= n_ctx
        ):
            return None  # a fresh epoch past the threshold: nothing to summarise yet, and it fits
        return (
            size.tokens,
            f"prompt of {size.tokens:,} tokens, {size.tokens / n_ctx:.0%} of {n_ctx:,}",
        )

    async def size(self, turn: CompactedTurn, epoch: Epoch) -> Size:
        """The next prompt's size: known from the previous request plus an upper bound for what
        was appended since, or, in an epoch with no request yet, an upper bound for all of it."""
        messages = turn.log.replay_messages(turn.session)
        # The epoch's last request the server reported counts for (a prompt it read).
        previous = turn.log.latest_request(turn.session, epoch=epoch.number, counted=True)
        if previous is None:
            bound = upper_bound_tokens(epoch.tools_text) + sum(map(upper_bound_tokens, messages))
            return Size(bound, exact=False)
        total, appended = known_size(previous, messages)
        estimate = estimate_prompt(total, appended)
        assert estimate is not None
        return Size(estimate, exact=not appended)

    async def _count_exactly(self, turn: CompactedTurn, epoch: Epoch) -> int:
        messages = turn.log.replay_messages(turn.session)
        return await self.budget.count_prompt(build_body(turn.settings, epoch.tools_text, messages))

    async def compact(
        self,
        turn: CompactedTurn,
        outcome: TurnOutcome,
        epoch: Epoch,
        entries: list[Entry],
        *,
        size: int | None,
        why: str,
    ) -> Epoch:
        """Summarise ``epoch`` and open the next one with the summary and the latest user
        message(s), cut to fit if one is too long."""
        block = latest_user_block(entries)
        summary = written_summary(entries, turn.session, epoch.number)
        if summary is None and size is not None and await self._summary_fits(size):
            summary = await self._summarise(turn, outcome, epoch)
        if not summary:
            summary = excerpt_summary([e for e in entries if e not in block])
        carried = [await self.fit_input(user_text(e), "this message") for e in block]
        rounds = tool_rounds_under_way(entries, block)
        with turn.log.transaction():
            new = turn.log.start_epoch(
                turn.session,
                reason=f"compaction: {why}",
                tools_text=epoch.tools_text,
                system_text=epoch.system_text,
            )
            turn.log.append_user(
                turn.session,
                summary_message(summary, epoch.number),
                external_key=summary_key(turn.session, new.number),
            )
            for index, text in enumerate(carried):
                key = carry_key(turn.session, new.number, index)
                turn.log.append_user(turn.session, text, external_key=key)
            turn.log.copy_entries(turn.session, rounds)
            turn.log.append_note(turn.session, f"compacted epoch {epoch.number}: {why}")
        outcome.notices.append(notice(epoch.number, new.number))
        outcome.compacted = True
        log.info("session %s compacted into epoch %d (%s)", turn.session, new.number, why)
        return new

    async def _summary_fits(self, size: int) -> bool:
        n_ctx = await self.budget.n_ctx()
        needed = size + INSTRUCTION_TOKENS + self.rules.summary_tokens(n_ctx)
        return needed + self.rules.margin <= n_ctx

    async def _summarise(self, turn: CompactedTurn, outcome: TurnOutcome, epoch: Epoch) -> str:
        """Ask the model for the summary: the instruction is appended first, so the request is
        the epoch's messages as stored; thinking and length are capped."""
        n_ctx = await self.budget.n_ctx()
        turn.log.append_user(
            turn.session, INSTRUCTION, external_key=instruction_key(turn.session, epoch.number)
        )

        def report(status: Status) -> None:
            # The phase shows; the summary's text does not stream into the turn's answer.
            turn.report(replace(status, text="") if status.text else status)

        summariser = turn.summariser(
            report,
            max_tokens=self.rules.summary_tokens(n_ctx),
            think_cap=self.rules.summary_think_cap,
        )
        attempt = await summariser.request(RequestKind.COMPACTION, outcome)
        if not attempt.result.complete:
            log.warning("compaction request of %s failed: %s", turn.session, attempt.result.detail)
            return ""
        return attempt.result.assembler.message().content.strip()


async def _byte_count(text: str) -> int:
    return len(text.encode("utf-8"))


def _epoch_entries(turn: CompactedTurn, epoch: Epoch) -> list[Entry]:
    return turn.log.epoch_entries(turn.session, epoch.number)
