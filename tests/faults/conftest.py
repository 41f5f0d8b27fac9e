"""Fault and load tests ("Scale-out and faults"): real worker processes, real Valkey, kill -9, restarts.

The fixtures are the integration suite's: ``valkey`` (tests/conftest.py) and
``redis_url``/``calls`` (tests/integration/conftest.py), re-exported here.
"""

from tests.integration.conftest import calls, redis_url  # noqa: F401 - pytest fixtures
