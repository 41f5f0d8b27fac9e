"""The MCP server: the model-facing tools of one bound session, over stdio or streamable HTTP."""
