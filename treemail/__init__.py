"""treemail: durable agent-to-agent mail for LLM agent delegation trees."""

PROTOCOL_VERSION = 9
