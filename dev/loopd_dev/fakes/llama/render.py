"""Render messages and tools into a prompt string, the way a ChatML template with tools does.

The tools block sits at the very top of the system block, so any change to ``tools`` changes the
prompt from its first lines on. Assistant turns are rendered with exactly the text the fake model
generates (:func:`render_assistant_body`), so a client that replays a turn as streamed extends the
cached prompt, and one that changes a byte does not.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from loopcommon.jsonbytes import dumps

from .messages import Message, ToolCallText
from .tokenize import EOS

GENERATION_PROMPT = "<|im_start|>assistant\n"
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more of these {count} functions to assist with the user "
    "query.\n\nFunction signatures are inside <tools></tools>:\n<tools>\n"
)
_TOOLS_FOOTER = (
    "</tools>\n\nTo call a function, write <tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass(frozen=True)
class TemplateOptions:
    """Switches that imitate different templates.

    ``drop_past_reasoning`` imitates templates that render reasoning only for assistant turns
    after the last user message, so each new user turn re-reads the previous answer.
    ``thinking`` false imitates a template with no think block: the model never reasons.
    """

    drop_past_reasoning: bool = False
    thinking: bool = True


class Part(Enum):
    """What a stretch of generated text is, for the stream's deltas."""

    MARKUP = "markup"
    REASONING = "reasoning"
    CONTENT = "content"
    ARGUMENTS = "arguments"


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    part: Part
    call_index: int = -1


@dataclass(frozen=True)
class AssistantText:
    """An assistant turn as text, with which stretch is reasoning, content or call arguments."""

    text: str
    spans: tuple[Span, ...]


class _Builder:
    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.spans: list[Span] = []
        self.length = 0

    def add(self, text: str, part: Part, call_index: int = -1) -> None:
        if text:
            self.spans.append(Span(self.length, self.length + len(text), part, call_index))
            self.chunks.append(text)
            self.length += len(text)

    def build(self) -> AssistantText:
        return AssistantText("".join(self.chunks), tuple(self.spans))


def render_assistant_body(
    reasoning: str,
    content: str,
    tool_calls: Sequence[ToolCallText],
    *,
    think_block: bool | None = None,
) -> AssistantText:
    """The assistant turn between ``<|im_start|>assistant\\n`` and ``<|im_end|>``.

    The think block is written when there is reasoning, or when ``think_block`` forces it.
    """
    out = _Builder()
    if reasoning or think_block:
        out.add("<think>\n", Part.MARKUP)
        out.add(reasoning, Part.REASONING)
        out.add("\n</think>\n\n", Part.MARKUP)
    out.add(content, Part.CONTENT)
    for index, call in enumerate(tool_calls):
        out.add(f'<tool_call>\n{{"name": {dumps(call.name)}, "arguments": ', Part.MARKUP)
        out.add(call.arguments, Part.ARGUMENTS, index)
        out.add("}\n</tool_call>", Part.MARKUP)
    return out.build()


def render_prompt(
    messages: Sequence[Message],
    tools: Sequence[Any],
    options: TemplateOptions = TemplateOptions(),
) -> str:
    """The whole prompt: tools and system text, every message, then the generation prompt.

    A trailing assistant message is a prefill: it is left open and the model continues it.
    """
    out: list[str] = []
    rest = list(messages)
    system_text = rest.pop(0).content if rest and rest[0].role == "system" else None
    if tools:
        # The count comes first, so adding or removing a tool changes the prompt near its start.
        header = _TOOLS_HEADER.format(count=len(tools))
        block = header + "".join(dumps(tool) + "\n" for tool in tools) + _TOOLS_FOOTER
        if system_text:
            block += "\n\n" + system_text
        out.append(f"<|im_start|>system\n{block}{EOS}\n")
    elif system_text is not None:
        out.append(f"<|im_start|>system\n{system_text}{EOS}\n")
    last_user = max((i for i, m in enumerate(rest) if m.role == "user"), default=-1)
    for index, message in enumerate(rest):
        is_prefill = index == len(rest) - 1 and message.role == "assistant"
        keep_reasoning = not options.drop_past_reasoning or index > last_user
        out.append(_render_message(message, keep_reasoning=keep_reasoning, is_prefill=is_prefill))
    if not (rest and rest[-1].role == "assistant"):
        out.append(GENERATION_PROMPT)
    return "".join(out)


def _render_message(message: Message, *, keep_reasoning: bool, is_prefill: bool) -> str:
    if message.role == "assistant":
        reasoning = message.reasoning if keep_reasoning else ""
        body = render_assistant_body(reasoning, message.content, message.tool_calls).text
        return GENERATION_PROMPT + body + ("" if is_prefill else f"{EOS}\n")
    if message.role == "tool":
        return f"<|im_start|>user\n<tool_response>\n{message.content}\n</tool_response>{EOS}\n"
    return f"<|im_start|>{message.role}\n{message.content}{EOS}\n"


def template_source(options: TemplateOptions) -> str:
    """The template text ``/props`` reports; its hash changes with the rendering switches."""
    reasoning_rule = (
        "{%- if loop.index0 > ns.last_user and m.reasoning_content %}"
        if options.drop_past_reasoning
        else "{%- if m.reasoning_content %}"
    )
    return (
        "{#- loopd fake ChatML template with tools and thinking -#}\n"
        "{%- if tools %}<|im_start|>system\n# Tools ... <tools>{% for t in tools %}"
        "{{ t | tojson }}\n{% endfor %}</tools>...{% endif %}\n"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        f"{reasoning_rule}<think>\n{{{{ m.reasoning_content }}}}\n</think>\n\n{{%- endif %}}"
        "{{ m.content }}<|im_end|>\n{%- endfor %}\n"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
