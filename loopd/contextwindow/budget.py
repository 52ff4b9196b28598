"""The context budget: how big the next prompt is, when to compact, how big one input may be.

A slot holds ``n_ctx`` tokens, and the server answers a prompt that does not fit with a 400
(``exceed_context_size_error``; ``test_prompt_over_the_context`` in
tests/reliability/test_server_faults.py). loopd keeps well below that:

- The next prompt's size is known without asking the server in the common case: the previous
  request's prompt (``cache_n + prompt_n``) plus what it generated (``predicted_n``), plus what
  was appended since. The appended part is bounded from above by its UTF-8 length (a token is at
  least one byte), which is close enough for a user line or a tool result. Only when that upper
  bound crosses the threshold is the prompt counted exactly (``/apply-template`` + ``/tokenize``).
- Past ``compact_at`` of the context a turn compacts before its first request. Within a turn the
  conversation may grow past the threshold (tool rounds), and compaction happens mid-turn only
  when the next request and its answer would not fit at all.
- One input (a user message, a tool result) may take at most ``input_cap`` tokens: what is left
  of the context above the threshold, less the room a compaction needs. So a turn that starts just
  under the threshold can always still send its compaction request. A longer input is cut, with a
  visible note saying so, before it is ever sent.

On a shared pool (a unified KV pool: every slot reports the whole pool as its ``n_ctx``, and the
requests running at once share it) the budget's context is a share of the pool: the pool divided
by how many long requests to expect at once (``LOOPD_POOL_REQUESTS``, two on production: loopd and
one other client). A session that alone filled 75 % of the pool could not run beside any other long
request, and overflowing the pool fails every request running (docs/production-shape.md, "What
loopd's engine must change", item 5; ``loopd.contextwindow.pool``).

The decisions are pure functions; ``ServerBudget`` is the thin I/O shell that asks the server.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from loopd.engine.client import InferenceClient
from loopd.errors import ServerRejected

# Role markers and separators the template puts around one message; generous for the templates
# seen (ChatML: 5 tokens).
MESSAGE_OVERHEAD = 16
# A compaction cannot free anything below this much room per input; a smaller context is not one
# loopd can hold a conversation in.
MIN_INPUT_CAP = 256


@dataclass(frozen=True)
class BudgetRules:
    """The fixed numbers of the budget; ``n_ctx`` comes from the server. The first three are
    settings (LOOPD_COMPACT_AT, LOOPD_MAX_TOKENS, LOOPD_SUMMARY_MAX_TOKENS), whose defaults are
    these (``loopd.config`` takes them from here)."""

    compact_at: float = 0.75
    max_tokens: int = 12288  # the turn's own max_tokens: room an answer may take
    summary_max_tokens: int = 512  # the compaction request's max_tokens
    summary_think_cap: int = 256  # thinking allowed in the compaction request
    margin: int = 64  # slack for the template's end-of-turn tokens and rounding

    def threshold(self, n_ctx: int) -> int:
        return int(n_ctx * self.compact_at)

    def answer_room(self, n_ctx: int) -> int:
        """The room one answer may take: ``max_tokens``, but never more than the context left
        above the threshold. A turn starts below the threshold, so the rest is the answer's;
        without this bound a ``max_tokens`` larger than a small slot (12288 against the dev
        server's 4096) would make every tool round compact first."""
        return max(0, min(self.max_tokens, n_ctx - self.threshold(n_ctx)))

    def summary_tokens(self, n_ctx: int) -> int:
        """The summary's max_tokens: at most a sixteenth of a small context."""
        return max(min(self.summary_max_tokens, n_ctx // 16), 32)


class BudgetVerdict(StrEnum):
    FITS = "fits"
    COUNT_EXACTLY = "count exactly"  # the upper bound is over: ask the server for the real size
    COMPACT = "compact"


def judge(
    prompt_tokens: int, n_ctx: int, rules: BudgetRules, *, turn_start: bool, exact: bool
) -> BudgetVerdict:
    """What to do before a request whose prompt is ``prompt_tokens`` (exact, or an upper bound).

    At a turn's start the threshold applies; within a turn only the hard limit (the prompt and
    a full answer must fit), so that a turn is not cut in two by a compaction it does not need.
    """
    if turn_start:
        over = prompt_tokens >= rules.threshold(n_ctx)
    else:
        over = prompt_tokens + rules.answer_room(n_ctx) + rules.margin > n_ctx
    if not over:
        return BudgetVerdict.FITS
    return BudgetVerdict.COMPACT if exact else BudgetVerdict.COUNT_EXACTLY


def upper_bound_tokens(text: str) -> int:
    """At most this many tokens: every token is at least one byte (special tokens aside, which
    plain text does not contain), plus the template's markers around a message."""
    return len(text.encode("utf-8")) + MESSAGE_OVERHEAD


def estimate_prompt(previous_total: int | None, appended: list[str]) -> int | None:
    """The next prompt's size, from the previous request's ``cache_n + prompt_n + predicted_n``
    and an upper bound for each message appended since; None without a previous request."""
    if previous_total is None:
        return None
    return previous_total + sum(upper_bound_tokens(message) for message in appended)


def input_cap(n_ctx: int, rules: BudgetRules, instruction_tokens: int) -> int:
    """The most tokens one input may take.

    A turn may begin with its prompt just under the threshold and the previous answer after it;
    its compaction request then adds the new input and the instruction, and needs room for the
    summary. What is left of the context after all that is what one input may have.
    """
    room = (
        n_ctx
        - rules.threshold(n_ctx)
        - rules.answer_room(n_ctx)
        - instruction_tokens
        - rules.summary_tokens(n_ctx)
        - rules.margin
    )
    return max(room, MIN_INPUT_CAP)


@dataclass(frozen=True)
class Cut:
    """An input as it will be sent: whole, or cut with a note (``cap``: the most it may take)."""

    text: str
    original_tokens: int
    was_cut: bool
    cap: int = 0


def cut_note(
    original_tokens: int, cap: int, dropped_chars: int, what: str, kept_in: str | None = None
) -> str:
    """The visible note put where an over-long input was cut; ``kept_in``: the file of the
    workspace that holds the input whole."""
    rest = (
        f"the remaining {dropped_chars:,} characters are in the file {kept_in} of the "
        "workspace, which holds it whole (read_file reads it a part at a time: offset and limit)"
        if kept_in is not None
        else f"the remaining {dropped_chars:,} characters were left out"
    )
    return (
        f"\n\n[loopd: {what} was cut here. It was {original_tokens:,} tokens, more than the "
        f"{cap:,} one message may take in this model's context; {rest}.]"
    )


def cut_text(
    text: str,
    keep_chars: int,
    original_tokens: int,
    cap: int,
    what: str,
    kept_in: str | None = None,
) -> str:
    """The first ``keep_chars`` characters of ``text`` and the note saying what was left out."""
    keep_chars = max(0, min(keep_chars, len(text)))
    note = cut_note(original_tokens, cap, len(text) - keep_chars, what, kept_in)
    return text[:keep_chars] + note


TokenCount = Callable[[str], Awaitable[int]]


async def fit_input(
    text: str,
    cap: int,
    count: TokenCount,
    what: str = "this message",
    kept_in: str | None = None,
) -> Cut:
    """``text`` if it fits in ``cap`` tokens, else its head with a note, counted to fit.

    The first cut is proportional to the overshoot; each later one keeps four fifths of the
    previous, so a text whose tokens are unevenly spread still ends within a few counts.
    """
    tokens = await count(text)
    if tokens <= cap:
        return Cut(text, tokens, was_cut=False, cap=cap)
    keep = int(len(text) * cap / tokens * 0.95)
    while True:
        candidate = cut_text(text, keep, tokens, cap, what, kept_in)
        if keep == 0 or await count(candidate) <= cap:
            return Cut(candidate, tokens, was_cut=True, cap=cap)
        keep = int(keep * 0.8)


def cut_notice(cut: Cut, kept_in: str | None, refusal: str | None = None) -> str:
    """What the person is told of their message ``cut`` to fit the context, in the terminal
    and in the thread alike: what the model read, and where the whole message is kept (or why
    it could not be)."""
    said = (
        f"Your message was {cut.original_tokens:,} tokens, more than the {cut.cap:,} one "
        "message may have in this model's context: the model reads its first part"
    )
    if kept_in is not None and refusal is None:
        return f"{said}, and the whole message is kept in its workspace as {kept_in}, to read."
    why = f" ({refusal})" if refusal else ""
    return f"{said} only; the rest could not be kept{why}."


def context_share(pool: int, *, shared: bool, requests: int) -> int:
    """The context one session may plan with: the whole slot, or on a shared pool its share."""
    return max(pool // max(requests, 1), 1) if shared else pool


class ServerBudget:
    """Asks the server what the budget needs: the slot's context and exact token counts.

    The slot's context is read once from ``/props`` (the figure the self-test checks) and kept;
    a caller that already knows it (from the self-test) passes it in. ``shared`` and
    ``requests`` say whether it is a pool shared by the requests running at once, and by how
    many long ones (``context_share``).
    """

    def __init__(
        self,
        client: InferenceClient,
        *,
        n_ctx: int | None = None,
        shared: bool = False,
        requests: int = 1,
    ) -> None:
        self.client = client
        self._n_ctx = n_ctx
        self.shared = shared
        self.requests = requests

    async def n_ctx(self) -> int:
        """The context the budget plans with (``context_share`` of the slot's)."""
        return context_share(await self.pool(), shared=self.shared, requests=self.requests)

    async def pool(self) -> int:
        """The slot's whole context as the server reports it (on a unified pool: the pool)."""
        if self._n_ctx is None:
            props = await self.client.props()
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            if not isinstance(n_ctx, int) or n_ctx <= 0:
                raise ServerRejected(
                    self.client.url, 200, "/props has no default_generation_settings.n_ctx"
                )
            self._n_ctx = n_ctx
        return self._n_ctx

    async def count_text(self, text: str) -> int:
        """Tokens of plain text, as it sits inside a message (no special tokens parsed)."""
        body = {"model": self.client.model, "content": text, "parse_special": False}
        return self._token_count(await self._post("/tokenize", body))

    async def count_prompt(self, request_body: bytes) -> int:
        """The exact prompt a chat request would be: rendered by the server, then tokenized."""
        chat: dict[str, Any] = json.loads(request_body)
        rendered = await self._post("/apply-template", chat)
        prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
        if not isinstance(prompt, str):
            raise ServerRejected(self.client.url, 200, "/apply-template answered no prompt")
        body = {"model": self.client.model, "content": prompt, "add_special": True}
        return self._token_count(await self._post("/tokenize", body))

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return await self.client.post_json(path, body, self.client.connect_s * 6)

    def _token_count(self, answer: Any) -> int:
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise ServerRejected(self.client.url, 200, "/tokenize answered no token list")
        return len(tokens)
