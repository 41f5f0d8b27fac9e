"""Decide functions: pure, from (command, what was loaded) to events, or a refusal with its stable code.

One module per concern: ``send`` (the model's send_message), ``lifecycle``
(what the host does to a session), ``approvals``; the rules that more than
one of them needs are decided once, in ``idempotency``, ``wake`` and
``guards``.
"""
