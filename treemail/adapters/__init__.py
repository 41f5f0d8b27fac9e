"""Adapters the domain needs at its edge: the event store and its Lua, keys, connection, embedded
server, command codec, view store, configuration loading, metrics."""
