"""The session stream category: events, commands, state and the pure decider."""
