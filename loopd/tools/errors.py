"""The exceptions of the tools package.

Two families, because they end in different places:

- ``ToolsSpecError`` stops loopd at startup: the tools file is broken, and no request may be sent
  with a tools array nobody has checked.
- ``ToolFailure`` ends one tool call: its message is written for the model (it names the problem
  and, where it can, what to do instead) and becomes the text of a failed ``ToolResult``.
"""

from loopd.errors import LoopdError


class ToolsError(LoopdError):
    """Base of every exception raised by ``loopd.tools``."""


class ToolsSpecError(ToolsError):
    """The tools file cannot be used: unreadable, not JSON, or not the expected shape."""


class ToolSetupError(ToolsError):
    """The tools cannot be set up safely: no workspace, or a protected path tools could see."""


class NotACoreToolError(ToolsError):
    """A broker tool (``find_tool``, ``call_tool``) was handed to the core tool runner.

    This is a dispatch bug in the caller, not a model mistake, so it is raised, not returned.
    """


class ToolFailure(ToolsError):
    """A tool call failed in a way the model can act on; ``str(exc)`` is the text it reads."""


class PathRefused(ToolFailure):
    """A path names something outside the workspace, or is not a plain relative path."""


class LimitExceeded(ToolFailure):
    """Content is larger than the tool's cap allows."""


class WorkspaceRefused(ToolFailure):
    """A session whose name cannot have a workspace (``""``, ``.``, ``..``)."""
