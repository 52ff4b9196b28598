"""The tools loopd runs inside the box, and the tools file the model is shown.

``spec`` loads the fixed tools array of an epoch; ``core`` runs the core tools (files in the
workspace, shell commands); ``find_tool`` and ``call_tool`` are declared here but executed by
brokerd (``is_broker_tool`` tells them apart). See README.md in this folder for why each tool is
in the core set.
"""

from loopd.tools.command import Sandbox, detect_sandbox, plain_sandbox
from loopd.tools.core import ToolContext, ToolResult, make_tool_context, run_core_tool
from loopd.tools.errors import (
    NotACoreToolError,
    PathRefused,
    ToolFailure,
    ToolSetupError,
    ToolsSpecError,
)
from loopd.tools.limits import ToolLimits
from loopd.tools.spec import ToolsSpec, load_tools_spec, parse_tools_spec

__all__ = [
    "NotACoreToolError",
    "PathRefused",
    "Sandbox",
    "ToolContext",
    "ToolFailure",
    "ToolLimits",
    "ToolResult",
    "ToolSetupError",
    "ToolsSpec",
    "ToolsSpecError",
    "detect_sandbox",
    "load_tools_spec",
    "make_tool_context",
    "parse_tools_spec",
    "plain_sandbox",
    "run_core_tool",
]
