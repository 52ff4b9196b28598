"""Pure replay: the messages of a request, built from stored serializations only.

Nothing here serializes a message that was already sent. A message is serialized once, when it is
appended (``user_message``, ``tool_message``, ``system_message``), or arrives serialized (an
assistant message, as assembled from the stream); a request's messages are those stored strings,
in log order, and the request body embeds them with ``messages_array``.
"""

from collections.abc import Sequence

from loopcommon import jsonbytes


def system_message(text: str) -> str:
    return jsonbytes.dumps({"role": "system", "content": text})


def user_message(text: str) -> str:
    return jsonbytes.dumps({"role": "user", "content": text})


def tool_message(tool_call_id: str, content: str) -> str:
    return jsonbytes.dumps({"role": "tool", "tool_call_id": tool_call_id, "content": content})


def messages_array(messages: Sequence[str]) -> str:
    """The JSON text of a request's ``messages`` field, from the stored message texts."""
    return "[" + ",".join(messages) + "]"
