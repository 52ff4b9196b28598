"""Idle means silent: which requests loopd may send to the shared server, and when. Pure.

The server is shared: other clients use the same router, which holds a few models at once
(``--models-max``), and each model's child sleeps after an idle time (``--sleep-idle-seconds``;
six hours on production), dropping its weights and every cache to give the GPU back. loopd must
never be the reason a model stays awake, or comes back when nobody asked. Measured on build
11434 (``tests/durable/test_quiet_real.py`` keeps each fact): a sleeping model answers
``/health``, ``/props`` and ``/models`` asleep, and none of them counts as activity; every
other request (``/slots``, a chat request, the control call, a slot's save or restore,
``/apply-template``, ``/tokenize``) wakes it first, and restarts its idle time. A router
request for a model that is not loaded loads it (and may evict another client's model to make
room) unless it carries ``autoload=false`` (GET and POST alike).

So, by what the request is for (``Purpose``):

- **A person waits** (a turn and everything it does: its liveness polls, its compaction, its
  save at the end; ``loopd selftest`` run by hand): any request. It may wake the model or load
  it, as any client's would.
- **A background check** (the server watch and its reading of the model):
  only the requests a sleeping model answers asleep, with ``autoload=false``, so that checking
  as often as it likes changes nothing on the server.
- **Background work** (a prewarm, the self-test's probes at ``loopd serve``'s start or a down
  endpoint's re-check): what a check may send, and
  what needs the model only while it is awake right now (``ModelStatus.AWAKE``, read from the
  server without waking it). Work on a model that sleeps or is not loaded waits for a person.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from loopd.engine.modelstate import ModelStatus


class Call(StrEnum):
    """Every request loopd makes of llama-server, by route."""

    HEALTH = "GET /health"
    PROPS = "GET /props"
    MODELS = "GET /models"
    SLOTS = "GET /slots"
    CHAT = "POST /v1/chat/completions"
    CONTROL = "POST /v1/chat/completions/control"
    SLOT_SAVE = "POST /slots/{id}?action=save"
    SLOT_RESTORE = "POST /slots/{id}?action=restore"
    APPLY_TEMPLATE = "POST /apply-template"
    TOKENIZE = "POST /tokenize"


# Answered from what the server already holds: a sleeping model stays asleep, and its idle time
# runs on (build 11434: each route's handler says whether it may run asleep).
# (``/metrics`` is answered asleep too; loopd never asks it.)
ANSWERED_ASLEEP = frozenset({Call.HEALTH, Call.PROPS, Call.MODELS})


class Purpose(StrEnum):
    PERSON = "a person waits"
    CHECK = "a background check"
    WORK = "background work"


@dataclass(frozen=True)
class Verdict:
    """Whether a request may go now, and whether it may load the model (``autoload``: else it
    carries ``autoload=false``, ``router_params``)."""

    allowed: bool
    autoload: bool
    why: str = ""


def may_send(call: Call, purpose: Purpose, model: ModelStatus = ModelStatus.UNKNOWN) -> Verdict:
    """The rule (see the module doc). ``model``: the model's state as last read without waking
    it; only background work looks at it."""
    if purpose is Purpose.PERSON:
        return Verdict(allowed=True, autoload=True)
    if call in ANSWERED_ASLEEP:
        return Verdict(allowed=True, autoload=False)
    if purpose is Purpose.CHECK:
        return Verdict(False, False, f"a background check never sends {call.value}: it wakes")
    if model is ModelStatus.AWAKE:
        return Verdict(allowed=True, autoload=False)
    return Verdict(False, False, f"the model is {model.value}: background work waits for a person")


def router_params(purpose: Purpose) -> dict[str, str]:
    """The query parameters a router request of ``purpose`` carries: ``autoload=false`` unless a
    person waits (then none: the router's own default, ``--models-autoload``, holds)."""
    return {} if purpose is Purpose.PERSON else {"autoload": "false"}
