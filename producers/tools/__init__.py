"""The model-facing tools: strict argument parsing, each tool's definition and parser (send_message,
interrupt_agent, inspect/retry_message, the peer tools), the table that installs them per session, their
exported schemas, and how a tool call is answered (never by an exception)."""
