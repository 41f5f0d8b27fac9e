"""How a model-facing tool call is answered: never by an exception.

A refusal is the call's result (its stable code); a server fault or an
unexpected lifecycle state is the tool's own ``engine_shutdown`` code, which
says a retry of the same tool call is safe.
"""

from collections.abc import Awaitable, Callable

from treemail.adapters.faults import StoreError
from treemail.domain.errors import Code, LifecycleError, Rejected
from treemail.domain.results import error_result


async def answered(decide: Callable[[], Awaitable[dict]], shutdown: Code) -> dict:
    """``decide()`` parses and decides the call (both inside, so a parse refusal is answered too)."""
    try:
        outcome = await decide()
    except Rejected as rejection:
        return error_result(rejection.code.value, rejection.message)
    except (StoreError, LifecycleError) as error:
        return error_result(
            shutdown.value, f"no decision could be made ({type(error).__name__}); retrying this same tool call is safe"
        )
    return outcome.get("ok", outcome)
