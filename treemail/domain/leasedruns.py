"""Runs held by a lease instead of a process: an agent served over streamable HTTP (``producers/mcp/leased.py``).

No process holds such a run's claims open, nor notices when its client goes away, so each claim lasts a lease
(``mcp_lease_s``) rather than an attempt timeout, and the run itself lasts while the agent calls
(``mcp_idle_s``). The run id says which, so every pump decides the same from the stored state alone.
"""

LEASED_RUN_PREFIX = "mcp-http:"


def leased(run_id: str | None) -> bool:
    return run_id is not None and run_id.startswith(LEASED_RUN_PREFIX)
