"""Helpers for the long-session tests on the fake llama-server."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from loopd.contextwindow.budget import BudgetRules, ServerBudget
from loopd.contextwindow.compaction import Compactor
from loopd.sessionlog.store import SessionLog
from loopd.turn.loop import Turn
from loopd_dev.fakes.llama import FakeLlama, ModelSpec
from tests.engine.engine_support import MODEL, Served, make_turn, settings

MAX_TOKENS = 32
RULES = BudgetRules(compact_at=0.75, max_tokens=MAX_TOKENS, summary_max_tokens=96, margin=32)


def small_fake(n_ctx: int) -> FakeLlama:
    return FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=n_ctx)])


def gated_turn(server: Served, log: SessionLog, **overrides: Any) -> Turn:
    """A turn with the context gate, a small max_tokens and no thinking cap to speak of."""
    gate = Compactor(ServerBudget(server.client), RULES)
    turn = make_turn(server, log, settings=replace(settings(), max_tokens=MAX_TOKENS), gate=gate)
    return replace(turn, **overrides)


def words(count: int, seed: str = "w") -> str:
    return " ".join(f"{seed}{i}" for i in range(count))
