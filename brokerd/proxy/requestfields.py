"""The fields a chat request may carry to a shared llama-server, each with the reason (pure).

While ``inference_slots`` is set the box was given those slots and no more, and ``id_slot`` alone
does not hold it to them: some fields start work on other slots, or multiply the server's work
for everyone. So every top-level field of a chat request is looked up in ``CHAT_FIELDS``, the
fields llama-server (build 11434) reads on its chat route, each classified from the server's
source:

- ``n_cmpl`` and its alias ``n``: parallel completions of the prompt, one child task per extra
  completion (``handle_completions_impl``), each placed on another idle slot, whose cached prompt
  it overwrites. Only 1 passes.
- ``n_probs``, and ``logprobs`` / ``top_logprobs`` that set it: the top-N probabilities of every
  token (up to the whole vocabulary, each with its text), built and sent on the loop that serves
  every slot. Only up to ``MAX_PROBS`` pass (0 or less turns them off).
- ``lora``: per-request adapter scales; a slot whose adapters differ from the others' cannot be
  batched with them (``can_batch_with``), so every decode step runs one more batch. Only an empty
  list passes.
- ``backend_sampling``: puts the slot's sampler chain into the compute graph that the whole batch
  shares (``llama_set_sampler``). Only false passes.
- ``model`` and ``id_slot`` are checked by the inference policy itself.
- Everything else shapes the one conversation's prompt, its parsing, its sampling on its own
  slot (per token, over at most the vocabulary and the slot's context) or the answer's format;
  each group below says which.

A field the table does not name is refused: a newer server may read a field this table has not
looked at (tests/security/test_slot_fields.py compares the table with the provisioned server's
source). A JSON null is the server's default for every field (it reads null as absent), so it
passes. A repeated key is read as its last value by Python's json and by the server's
nlohmann::json alike.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

MAX_PROBS: Final = 20  # as OpenAI bounds top_logprobs


@dataclass(frozen=True)
class FieldRule:
    """Why a field is allowed; ``accepts`` (None: any value) and ``bound`` (its words) when
    only some values are."""

    why: str
    accepts: Callable[[object], bool] | None = None
    bound: str = ""

    def refusal(self, value: object) -> str | None:
        if value is None or self.accepts is None or self.accepts(value):
            return None
        return f"{self.why} (allowed: {self.bound})"


def _one(value: object) -> bool:
    # JSON true would read as 1 too; a flag is not a count.
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 1


def _few_probs(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value <= MAX_PROBS


def _probs_flag(value: object) -> bool:
    # The chat route reads logprobs as a flag; a number there is the schema's alias of n_probs.
    return isinstance(value, bool) or _few_probs(value)


def _no_adapters(value: object) -> bool:
    return value == []


def _false(value: object) -> bool:
    return value is False


PARALLEL: Final = FieldRule(
    "it runs more completions at once, each on another slot than the one named", _one, "1"
)
PROBS: Final = FieldRule(
    "it makes the server build and send that many probabilities for every token, on the loop "
    "that serves every slot",
    _few_probs,
    f"at most {MAX_PROBS}",
)
PROBS_FLAG: Final = FieldRule(PROBS.why, _probs_flag, f"true, false or at most {MAX_PROBS}")
ADAPTERS: Final = FieldRule(
    "a slot with adapters of its own cannot be batched with the other slots", _no_adapters, "[]"
)
BACKEND_SAMPLING: Final = FieldRule(
    "it puts the slot's samplers into the compute graph every slot shares", _false, "false"
)
POLICY: Final = FieldRule("checked by the inference policy (inference_models, inference_slots)")
CONVERSATION: Final = FieldRule("the conversation and its rendering into the one prompt")
PARSING: Final = FieldRule("how the one answer is parsed (tool calls, reasoning)")
SAMPLING: Final = FieldRule(
    "sampling on the request's own slot: per token, over at most the vocabulary and the slot's "
    "context (as top_k = 0 does)"
)
LENGTH: Final = FieldRule("how long the one generation runs, bounded by its slot's context")
CACHE: Final = FieldRule("how the request's own slot reuses or shifts its own cache")
OUTPUT: Final = FieldRule("what the answer holds and how it is streamed")
GRAMMAR: Final = FieldRule(
    "a grammar on the request's own sampling (the tools of a request make one too)"
)


def _each(names: Iterable[str], rule: FieldRule) -> dict[str, FieldRule]:
    return dict.fromkeys(names, rule)


CHAT_FIELDS: Final[Mapping[str, FieldRule]] = {
    **_each(("n_cmpl", "n"), PARALLEL),
    "n_probs": PROBS,
    "top_logprobs": PROBS,
    "logprobs": PROBS_FLAG,
    "lora": ADAPTERS,
    "backend_sampling": BACKEND_SAMPLING,
    **_each(("model", "id_slot"), POLICY),
    **_each(
        (
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "add_generation_prompt",
            "continue_final_message",
            "chat_template_kwargs",
            "reasoning_effort",
            "chat_format",
            "generation_prompt",
            "message_delimiters",
            # Replaced by the rendered conversation on the chat route.
            "prompt",
        ),
        CONVERSATION,
    ),
    **_each(
        (
            "chat_parser",
            "parse_tool_calls",
            "reasoning_format",
            "reasoning_control",
            "reasoning_budget_tokens",
            "thinking_budget_tokens",
            "reasoning_budget_start_tag",
            "reasoning_budget_end_tag",
            "reasoning_budget_end_tags",
            "reasoning_budget_message",
            "stop",
            "echo",
        ),
        PARSING,
    ),
    **_each(
        (
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "top_n_sigma",
            "typical_p",
            "xtc_probability",
            "xtc_threshold",
            "dynatemp_range",
            "dynatemp_exponent",
            "repeat_last_n",
            "repeat_penalty",
            "frequency_penalty",
            "presence_penalty",
            "dry_multiplier",
            "dry_base",
            "dry_allowed_length",
            "dry_penalty_last_n",
            "dry_sequence_breakers",
            "mirostat",
            "mirostat_tau",
            "mirostat_eta",
            "adaptive_target",
            "adaptive_decay",
            "seed",
            "min_keep",
            "logit_bias",
            "samplers",
            "post_sampling_probs",
        ),
        SAMPLING,
    ),
    **_each(
        (
            "json_schema",
            "grammar",
            "grammar_type",
            "grammar_lazy",
            "grammar_triggers",
            "preserved_tokens",
            "response_format",
        ),
        GRAMMAR,
    ),
    **_each(
        (
            "max_tokens",
            "max_completion_tokens",
            "n_predict",
            "ignore_eos",
            "t_max_predict_ms",
            "n_indent",
        ),
        LENGTH,
    ),
    **_each(("cache_prompt", "n_cache_reuse", "n_keep", "n_discard"), CACHE),
    **_each(
        (
            "stream",
            "stream_options",
            "return_progress",
            "return_tokens",
            "timings_per_token",
            "sse_ping_interval",
            "response_fields",
            "verbose",
        ),
        OUTPUT,
    ),
}

UNKNOWN: Final = "brokerd does not know what it does to the shared server's other slots"


def field_refusal(body: Mapping[str, object]) -> tuple[str, str] | None:
    """The first field of a chat request ``body`` that may not reach a shared server, and why;
    None when every field may."""
    for name, value in body.items():
        rule = CHAT_FIELDS.get(name)
        if rule is None:
            return name, UNKNOWN
        if (why := rule.refusal(value)) is not None:
            return name, why
    return None
