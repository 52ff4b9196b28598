"""A turn: the loop of requests and tool calls that answers one message (``loop``), and the durable
sessions' saves and restores it makes (``saves``; the rule is ``loopd.engine.durable``). Above the
context window (``loopd.contextwindow``) and prewarm (``loopd.prewarm``), which it uses; below the
servers that build it (``loopd.endpoints``)."""
