"""The host contract (``host_contract.json``) on the Python host API, in process and over the gateway.

The same cases run in TypeScript over the gateway (``make test-typescript``,
``test_typescript_client.py``): one contract, every language.
"""

import pytest

from .backends import HostBackend, HttpBackend
from .interpreter import cases, run_case

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:60] for c in CASES])
async def test_the_python_host_api_keeps_the_contract(contract_stack, case):
    tm, _ = contract_stack
    await run_case(case, HostBackend(tm))


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:60] for c in CASES])
async def test_the_gateway_keeps_the_contract_with_every_answer_as_documented(contract_stack, case):
    _, base_url = contract_stack
    await run_case(case, HttpBackend(base_url))
