"""The Vancetope client agent (layer: client_agent): what runs on a user's workstation.

It announces this workstation's tools (native tools in a folder sandbox, plus the
user's own MCP servers from ``mcp.json``) to the brain, keeps a heartbeat, and runs
the brain's tool calls from its own Celery queue ``client.<id>``. It never imports
``brain`` and needs none of the server-only dependencies.
"""
