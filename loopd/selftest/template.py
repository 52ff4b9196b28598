"""The chat template, as the self-test sees it: the probe conversations. Pure. (Its sha256 is
``loopd.engine.modelstate.template_sha256``, part of the model's fingerprint.)

The probes render conversations through ``/apply-template`` (in ``probe.py``) and judge the
rendered prompts here:

- *keeps past reasoning*: an assistant turn with reasoning, then a new user message. A template
  that drops the earlier reasoning (llama.cpp's Qwen3.5 template does) re-renders that turn
  differently from what the model generated, so each new user turn re-reads the previous answer.
  That is a template cost, not a client fault, and the perf records label it so.
- *tool turn then user is a prefix extension*: the prompt of a conversation ending in a tool
  result, and the same conversation with a user message added. When the second does not begin
  with the first, a user message after tool calls costs a re-read from that turn on.
"""

from __future__ import annotations

from enum import StrEnum

from loopcommon.jsonbytes import dumps
from loopd.sessionlog.replay import system_message, tool_message, user_message
from loopd.wire.assemble import AssistantMessage, ToolCall

# Unlikely to occur in any template's own text, so finding it means the template rendered it.
REASONING_MARKER = "selftest-reasoning-7d1c"
PROBE_CALL_ID = "selftest-call-1"


class TemplateAnswer(StrEnum):
    """The answer to one template question; UNKNOWN when the server could not render it."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


def first_turn(system_text: str, user_text: str = "Say OK.") -> list[str]:
    """A new session's first request: system text and one user message."""
    return [system_message(system_text), user_message(user_text)]


def tool_turn(system_text: str, tool_name: str) -> list[str]:
    """A conversation ending in a tool result, built as loopd builds the messages it replays.

    The assistant message is what the engine stores for a turn that thought and then called a
    tool: content null, reasoning, one call with its argument text.
    """
    assistant = AssistantMessage(
        content="",
        reasoning_content=f"I will call {tool_name}. {REASONING_MARKER}",
        tool_calls=(ToolCall(PROBE_CALL_ID, tool_name, "{}"),),
    )
    tool = tool_message(PROBE_CALL_ID, "selftest tool result")
    return [*first_turn(system_text), _stored(assistant), tool]


def answered_then_user(system_text: str) -> list[str]:
    """An assistant turn with reasoning and an answer, then the next user message."""
    assistant = AssistantMessage("OK.", reasoning_content=f"The user wants OK. {REASONING_MARKER}")
    return [*first_turn(system_text), _stored(assistant), user_message("Again.")]


def user_after_tool(system_text: str, tool_name: str) -> list[str]:
    return [*tool_turn(system_text, tool_name), user_message("Thanks.")]


def _stored(message: AssistantMessage) -> str:
    """The assistant message's text as the session log stores it (``Turn`` does the same)."""
    return dumps(message.to_wire())


def judge_keeps_reasoning(prompt: str | None) -> TemplateAnswer:
    """From the rendered ``answered_then_user`` conversation (None: it did not render)."""
    if prompt is None:
        return TemplateAnswer.UNKNOWN
    return TemplateAnswer.YES if REASONING_MARKER in prompt else TemplateAnswer.NO


def judge_prefix_extension(before: str | None, after: str | None) -> TemplateAnswer:
    """Does the longer conversation's prompt begin, byte for byte, with the shorter one's?

    Both must be rendered without the generation prompt, which the next request replaces with
    the assistant turn itself.
    """
    if before is None or after is None:
        return TemplateAnswer.UNKNOWN
    return TemplateAnswer.YES if after.startswith(before) else TemplateAnswer.NO


def divergence(before: str, after: str, context: int = 40) -> str:
    """Where two prompts first differ, for a person reading the report."""
    index = next(
        (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
        min(len(before), len(after)),
    )
    return (
        f"prompts differ at character {index}: {before[index : index + context]!r} "
        f"became {after[index : index + context]!r}"
    )
