"""What publishes commands: the model-facing tool adapter, the command client, the host API facade."""
