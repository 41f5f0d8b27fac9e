"""What publishes commands, in four parts: ``host`` (the facade engines embed, and its parts), ``tools`` (the
model-facing tool surface), ``mcp`` (those tools served over MCP) and ``client`` (the command client)."""
