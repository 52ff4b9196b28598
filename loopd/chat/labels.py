"""What the status page says of a Mattermost thread: its channel, the person who started it and
its first words. Pure.

A label is made once, from the post that brought the thread to loopd, and kept in the chat state
(``ChatState.label_thread``). Its text is what people and the model wrote, so it is bounded here
and escaped where it is shown (``loopcommon.statuspage``).
"""

from __future__ import annotations

import re
from typing import Final

from loopcommon.statuspage import ThreadView
from loopd.chat.model import Channel, User

FIRST_WORDS_CHARS: Final = 80
NAME_CHARS: Final = 64
DIRECT_MESSAGE: Final = "direct message"  # the channel of a thread in a direct message
GROUP_MESSAGE: Final = "group message"
# How the log writes a post as a user message (``loopd.chat.adapter.user_text``): its author
# first, ``@username: message``, so the model knows who speaks.
AUTHOR: Final = re.compile(r"^@([^\s:]+): ")


def author_of(content: str) -> str | None:
    """The username a logged user message starts with, or None (not a Mattermost post)."""
    match = AUTHOR.match(content)
    return match.group(1) if match else None


def thread_label(root_id: str, channel: Channel, author: User, message: str) -> ThreadView:
    """The label of the thread ``root_id``, from the post that brought it (by ``author``)."""
    if channel.is_direct:
        where = DIRECT_MESSAGE
    elif channel.is_group:
        where = GROUP_MESSAGE
    else:
        where = "~" + channel.name[:NAME_CHARS]
    return ThreadView(
        root=root_id,
        channel=where,
        person=author.username[:NAME_CHARS],
        first_words=first_words(message),
    )


def first_words(message: str, limit: int = FIRST_WORDS_CHARS) -> str:
    """The message's start on one line: whitespace runs are one space, cut at a word near
    ``limit`` with an ellipsis."""
    flat = " ".join(message.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0] if " " in flat[:limit] else flat[:limit]
    return cut + "…"
