"""Which tool calls wait for a person, and what a decision looks like (pure).

A tool runs at once (``auto``) or only after a person allowed the call (``ask``). The mode of a
tool is, first to last: the ``[broker.approval]`` table of brokerd's config (a catalogue tool's
name, or an MCP tool's ``server.tool``), the tool's own ``approval`` (a catalogue file's, or the
``[[mcp]]`` server's for each of its tools), and else what the tool declares it does: a command
that may reach the network or write a host path asks, and so do the tools of an MCP server that
may (``network``, a ``:rw`` path, or a remote server behind a URL). Builtins run inside brokerd
and declare nothing: ``web_fetch`` reaches only the hosts the operator listed in
``web_fetch_allowlist`` (empty: none), which is that operator's approval already.

A call that asks and carries no decision is refused with an approval id (``ApprovalGate``). The
id is random and goes only to loopd, in the answer's ``approval_id`` field, never into the text
the model reads; loopd asks the person and sends the call again naming the id and the decision.
The id is bound to that one call (session, call id, tool and arguments), so it cannot approve
another.
"""

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from brokerd.tools.catalogue import CommandRun, ToolSpec
from loopcommon.approvals import ApprovalMode, Verdict

APPROVAL_ID_BYTES: Final = 18  # 144 random bits, URL-safe base64: 24 characters
MAX_DECIDER_CHARS: Final = 200


class ApprovalBody(BaseModel):
    """A person's decision, as loopd sends it with the call again."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1, max_length=64)
    decision: Verdict
    by: str = Field(
        min_length=1,
        max_length=MAX_DECIDER_CHARS,
        description="Who decided (``@alice``), or, for ``timeout``, how long nobody did.",
    )


def declared_effects(spec: ToolSpec) -> tuple[str, ...]:
    """What a catalogue command declares beyond reading: ``network``, ``writes``."""
    if not isinstance(spec.run, CommandRun):
        return ()
    effects = []
    if spec.confine.network:
        effects.append("network")
    if spec.confine.read_write:
        effects.append("writes")
    return tuple(effects)


def unknown_names(
    names: Collection[str], catalogue: Collection[str], servers: Collection[str]
) -> list[str]:
    """The ``names`` of ``[broker.approval]`` that no tool can have: a catalogue name the
    catalogue lacks, or ``server.tool`` of a server not configured (a misspelt name would leave
    its tool at its default without a word)."""
    unknown = []
    for name in sorted(names):
        server, dot, _ = name.partition(".")
        known = server in servers if dot else name in catalogue
        if not known:
            unknown.append(name)
    return unknown


def approval_mode(spec: ToolSpec, overrides: Mapping[str, ApprovalMode]) -> ApprovalMode:
    """The tool's mode: the config's table, the tool's own, else its declared effects."""
    if spec.name in overrides:
        return overrides[spec.name]
    if spec.approval is not None:
        return spec.approval
    return "ask" if declared_effects(spec) else "auto"


@dataclass(frozen=True)
class Asked:
    """An approval brokerd issued for one call, as its audit log has it."""

    id: str
    session: str
    call_id: str
    call_sha256: str
    tool: str
    asked_at: str
    decision: Verdict | None = None
    decided_by: str | None = None


@dataclass(frozen=True)
class Pending:
    """The call waits for a person: loopd is told ``approval_id`` (None: issue one now)."""

    approval_id: str | None


@dataclass(frozen=True)
class Decided:
    """The call carries a decision brokerd issued for it: run it, or answer who refused."""

    verdict: Verdict
    by: str
    new: bool  # not yet in the audit log (a retry of a recorded decision is not new)


@dataclass(frozen=True)
class NotThisCall:
    """The approval named is unknown, or belongs to another call, or was decided otherwise."""

    reason: str


GateAnswer = Pending | Decided | NotThisCall


def gate(
    asked: Asked | None, session: str, call_id: str, call_sha256: str, body: ApprovalBody | None
) -> GateAnswer:
    """What a call that asks gets: ``asked`` is the approval already issued for this call (by
    its key), if any; ``body`` what the call carries."""
    if asked is not None and asked.call_sha256 != call_sha256:
        return NotThisCall("its call id was asked about for another call")
    if body is None:
        if asked is not None and asked.decision is not None and asked.decided_by is not None:
            # Decided, then cut short before it ran (brokerd stopped): the decision stands.
            return Decided(asked.decision, asked.decided_by, new=False)
        # A retry before anyone decided names the same pending approval, not a second one.
        return Pending(asked.id if asked is not None else None)
    if asked is None or asked.id != body.id:
        return NotThisCall("it names an approval brokerd did not issue for this call")
    if (asked.session, asked.call_id, asked.call_sha256) != (session, call_id, call_sha256):
        return NotThisCall("it names an approval brokerd issued for another call")
    if asked.decision is not None and asked.decision != body.decision:
        return NotThisCall(f"that approval was already decided: {asked.decision}")
    return Decided(body.decision, body.by, new=asked.decision is None)


def waiting_result(name: str) -> str:
    """What the model would read if a call stopped at the gate (loopd asks a person instead)."""
    return (
        f"{name} needs a person's approval before it runs, and none was given: nothing was run. "
        "The person who started this turn is asked; wait for their decision."
    )


def not_this_call_result(name: str, reason: str) -> str:
    return f"{name} was not run: the approval sent with this call is not valid ({reason})."
