"""What the model reads once a person decided on a call that asked first (pure).

Both daemons ask: brokerd for the tools of its catalogue and its MCP servers
(``brokerd.approval``), loopd for its core tools (``loopd.approvals``). Either way the tool result
says who allowed the call, or who denied it and that the model should not try it again.
"""

from __future__ import annotations

from typing import Literal

ApprovalMode = Literal["ask", "auto"]  # a tool's calls wait for a person, or run at once
Verdict = Literal["allow", "deny", "timeout"]


def decided_result(name: str, verdict: Verdict, by: str, result: str | None = None) -> str:
    """The tool result the model reads after a decision: who allowed or refused it."""
    if verdict == "allow":
        return f"Allowed by {by}.\n{result or ''}".rstrip("\n")
    if verdict == "deny":
        return (
            f"{name} was not run: {by} denied this call. Do not try it again in this turn; "
            "answer without it, or ask what to do instead."
        )
    return (
        f"{name} was not run: nobody allowed it in time ({by}), so it was denied. Do not try it "
        "again in this turn; answer without it, or ask what to do instead."
    )
