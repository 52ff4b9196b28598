"""Who may decide on a turn's tool calls, and stop the turn (pure).

A turn belongs to the people whose messages it answers; the configured admins may act on any
turn. Their reaction on an approval question decides it, and their stop word or reaction stops
the turn; anyone else's is ignored. Names compare without case (Mattermost's usernames are lower
case; the admins setting may hold a username or a user id).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class Deciders:
    """The people whose messages the turn answers (lower case), and the admins."""

    people: frozenset[str]
    admins: frozenset[str] = frozenset()

    @classmethod
    def of(cls, people: Collection[str], admins: Collection[str] = ()) -> Deciders:
        return cls(frozenset(name.lower() for name in people), frozenset(admins))


def may_decide(deciders: Deciders, username: str, user_id: str = "") -> bool:
    """Whether ``username`` (with ``user_id``) may decide on the turn's calls, or stop it."""
    if username.lower() in deciders.people:
        return True
    return bool({username, user_id} & deciders.admins)
