"""The pure domain: events, commands, the fold, decide functions, permissions, envelope, errors.

No Redis, no asyncio, no I/O; nothing here imports another part of treemail.
Everything a decision needs is passed in, and every decision returns events
(or a refusal with its stable code).
"""
