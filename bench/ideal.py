"""The ideal of the cache benchmark: the tokens of each request that are new since the previous one.

Tokens come from the server itself: its ``/apply-template`` renders the exact request body and
its ``/tokenize`` counts the result. A request's new tokens are those after the longest common
prefix with what the server already holds from the previous request: that request's prompt, and,
when the previous reply is the model's own replayed exactly, the reply's ``predicted_n`` tokens
that follow it in the new prompt. A scripted reply is new to the server: it never generated it.

Where the template rewrites text the previous request sent (this thinking template drops the
reasoning of earlier turns at each new user message), the common prefix ends early and the ideal
counts the rewritten text as new: no client can avoid that cost. Such requests are labelled, as
are requests after a reply that was capped or cut by ``max_tokens`` and the first one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from bench.errors import BenchError

# A hybrid model's server resumes a prompt that diverged inside what the slot holds at its
# checkpoint this many tokens before the end of the previous prompt (docs/production-shape.md).
CHECKPOINT_BEFORE_END = 4

# loopd's target: prompt_n within this many tokens of the ideal on unlabelled requests. The
# server always re-evaluates the last token it generated (it was sampled, never decoded), and
# a reply cut short gets an end-of-turn marker from the template that the model never wrote.
TOLERANCE = 2


class Label(StrEnum):
    NONE = ""
    FIRST = "first of the epoch"
    TEMPLATE_REWRITE = "template drops reasoning"
    CAPPED = "after a capped reply"
    RETOKENIZED = "reply tokenized anew"
    # The template kept the previous prompt's text, but its last tokens came out differently
    # once text followed (a byte-level BPE splits a run of whitespace before a word).
    TAIL_TOKENIZED = "prompt's last piece tokenized anew"
    # The prompt diverged inside what the server held, and a hybrid model's server could only
    # go back to a checkpoint before that point (docs/production-shape.md).
    CHECKPOINT = "resumed at a checkpoint"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for index in range(n):
        if a[index] != b[index]:
            return index
    return n


@dataclass(frozen=True)
class Ideal:
    new_tokens: int
    shared: int  # tokens of this prompt the server holds from the previous request
    rewritten: bool  # the template changed text the previous request had sent
    shared_previous: int = 0  # the previous prompt's length in tokens (0 for the first)


def ideal(
    current: Sequence[int],
    previous: Sequence[int] | None,
    carried_reply: int,
    reply_rendered: bool = True,
) -> Ideal:
    """New tokens of ``current``.

    ``carried_reply`` is the number of tokens the server generated for the previous reply when
    that reply is replayed as generated (0 for a scripted reply); ``reply_rendered`` is False
    when the template left part of it out (its reasoning), so the server must re-read it.
    """
    if previous is None:
        return Ideal(len(current), 0, rewritten=False)
    shared = common_prefix(current, previous)
    rewritten = shared < len(previous) or not reply_rendered
    if not rewritten:
        shared = min(len(current), shared + carried_reply)
    return Ideal(len(current) - shared, shared, rewritten, len(previous))


def reply_tokenized_anew(previous_tokens: int, carried_reply: int, server_cache_n: int) -> bool:
    """The server kept the previous prompt but not all of the reply generated after it.

    A reply replayed byte for byte renders as the same text, but its tokens as generated can
    differ from that text tokenized again (whitespace generated as two tokens tokenizes as one;
    the hybrid preset's random tokens side by side tokenize to other tokens):
    the server then re-reads the reply from there, which no client that sends text avoids. Seen
    from the server's ``cache_n`` landing inside the reply, or, on a hybrid model, at its
    checkpoint just before the reply; a client that changed its prompt diverges before the
    reply, which this does not cover.
    """
    low = previous_tokens - CHECKPOINT_BEFORE_END
    return carried_reply > 0 and low <= server_cache_n < previous_tokens + carried_reply


def resumed_before_divergence(
    found: Ideal, previous_tokens: int, retokenized: bool, server_cache_n: int
) -> int:
    """Tokens the server read again from before the point where the prompt diverged from what
    it held: a hybrid model's checkpoint. The divergence is the ideal's shared prefix, or, when
    the reply was tokenized anew, at least the previous prompt's end."""
    divergence = previous_tokens if retokenized and not found.rewritten else found.shared
    return max(divergence - server_cache_n, 0)


def label(
    index: int,
    found: Ideal,
    previous_capped: bool,
    retokenized: bool = False,
    *,
    text_kept: bool = False,
    before_divergence: int = 0,
) -> Label:
    """The request's cause, the most certain first. ``text_kept``: the previous prompt's text
    is a prefix of this one's, so a divergence inside it is the tokenizer's, not the template's;
    ``before_divergence``: tokens the server re-read before the divergence (a checkpoint)."""
    if index == 0:
        return Label.FIRST
    if previous_capped:
        return Label.CAPPED
    if found.rewritten and text_kept and found.shared < found.shared_previous:
        return Label.TAIL_TOKENIZED
    if found.rewritten:
        return Label.TEMPLATE_REWRITE
    if retokenized:
        return Label.RETOKENIZED
    if before_divergence > TOLERANCE:
        return Label.CHECKPOINT
    return Label.NONE


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: list[int]


def reply_rendered(prompt_text: str, reasoning: str) -> bool:
    """Whether the template kept a reply's reasoning in the next prompt (templates trim it)."""
    return not reasoning.strip() or reasoning.strip() in prompt_text


class PromptTokens:
    """The server's own rendering and tokenization of a chat request body."""

    def __init__(self, http: httpx.AsyncClient, model: str) -> None:
        self.http = http
        self.model = model

    async def of(self, body: bytes) -> Prompt:
        """The prompt ``body`` renders to, and its tokens as the server would process them."""
        rendered = await self._post(
            "/apply-template", content=body, headers={"Content-Type": "application/json"}
        )
        prompt = rendered.get("prompt")
        if not isinstance(prompt, str):
            raise BenchError("/apply-template answered without a prompt")
        counted = await self._post(
            "/tokenize",
            json={
                "model": self.model,
                "content": prompt,
                "add_special": True,
                "parse_special": True,
            },
        )
        tokens = counted.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BenchError("/tokenize answered without a list of token ids")
        return Prompt(prompt, tokens)

    async def _post(self, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self.http.post(path, **kwargs)
        except httpx.HTTPError as exc:
            raise BenchError(f"{path} failed: {exc!r}") from exc
        if response.status_code != 200:
            raise BenchError(f"{path} answered {response.status_code}: {response.text[:300]}")
        data = response.json()
        if not isinstance(data, dict):
            raise BenchError(f"{path} answered something other than an object")
        return data
