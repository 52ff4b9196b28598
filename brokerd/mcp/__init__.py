"""MCP servers as tool sources of the broker.

Each ``[[mcp]]`` table of brokerd's config names one server (a confined stdio command, or a
streamable HTTP URL). Its tools join the catalogue as ``<server>.<tool>``: ``find_tool`` ranks
them with the others and ``call_tool`` runs them with the same gate, limits, audit log and
idempotency as every tool. The official SDK (``mcp``) speaks the protocol.

- ``config``: the ``[[mcp]]`` table;
- ``names``, ``specs``, ``results``: pure mappings (tool names, tool listings to catalogue
  entries, call results to the text the model reads);
- ``sandbox``: what a stdio server sees (declared paths and its own installation);
- ``transport``: the stdio transport through ``brokerd.confine``;
- ``server``, ``servers``: one connection's life (start, restart with backoff, stop), and all of
  them as one catalogue source;
- ``listing``: ``brokerd tools list``.
"""
