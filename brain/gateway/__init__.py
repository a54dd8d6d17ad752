"""The MCP gateway (issue 13): every tool a user may run — the server's and those of the
user's connected workstations — offered to any MCP client over streamable HTTP at ``/mcp``.

Pure decisions (``catalog``: which tools a user sees and under which names; ``pools``: tool
pools behind ``brain_specialized_cmd``) are apart from the glue (``calls``: a tool call as a
one-task tree through the router; ``server``: the SDK's low-level server, the bearer-token
gate and the list_changed watcher).
"""
