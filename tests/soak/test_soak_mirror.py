"""What the simulated users read of a thread: is a turn running, was my message answered."""

from __future__ import annotations

from typing import Any

from soak.mattermost import LogEntry, Mirror

BOT = "bot"


def entry(action: str, post_id: str, key: str, at: float, user: str = BOT) -> LogEntry:
    props: dict[str, Any] = {"loopd_turn": key, "loopd_part": 0} if key else {}
    return LogEntry(action, post_id, user, "c", "r1", "text", props, at)


def test_a_status_post_shows_a_running_turn_until_it_is_removed() -> None:
    mirror = Mirror(BOT)
    mirror.apply(entry("created", "u1", "", 1.0, user="u00"))
    assert mirror.status_post("r1") is None
    mirror.apply(entry("created", "s1", "mm:r1#1:status", 2.0))
    status = mirror.status_post("r1")
    assert status is not None
    assert status.post_id == "s1"
    mirror.apply(entry("deleted", "s1", "mm:r1#1:status", 3.0))
    assert mirror.status_post("r1") is None


def test_only_a_closing_post_answers_and_only_after_the_message() -> None:
    mirror = Mirror(BOT)
    mirror.apply(entry("created", "s1", "mm:r1#1:status", 2.0))
    mirror.apply(entry("created", "d1", "mm:r1#1:draft", 3.0))
    assert not mirror.replied_since("r1", 1.0)  # a status post and a draft answer nothing
    mirror.apply(entry("edited", "d1", "mm:r1#2", 4.0))  # the draft became the answer
    assert mirror.replied_since("r1", 1.0)
    assert not mirror.replied_since("r1", 5.0)
    mirror.apply(entry("created", "n1", "full:u9", 6.0))
    assert mirror.replied_since("r1", 5.0)
    assert not mirror.replied_since("other", 0.0)
