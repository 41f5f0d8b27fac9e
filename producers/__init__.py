"""What publishes commands, in three parts: ``host`` (the facade engines embed, and its parts), ``tools`` (the
model-facing tool surface) and ``mcp`` (those tools served over MCP). They talk only to ``treemail.services``."""
