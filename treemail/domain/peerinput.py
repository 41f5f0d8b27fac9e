"""The receiving agent's input schema on a peer route: checked once at registration, then per send. Pure.

The schema belongs to the receiver: a host registers it with the route, and
a send over that route whose body is not JSON matching it is refused with
``peer_message:input_mismatch`` before anything is stored. References are
resolved only inside the schema: an empty registry stops ``jsonschema`` from
fetching a remote ``$ref`` (its default still does, with a warning), so a
decision never does I/O.
"""

import json

from jsonschema import exceptions, validators
from referencing import Registry
from referencing.exceptions import Unresolvable

from .errors import Code, InvalidRequest, Rejected

MAX_ERROR_CHARS = 300
LOCAL_ONLY: Registry = Registry()


# A route's input schema the host gave that is no JSON Schema.
INVALID_SCHEMA = "peer_route:invalid_input_schema"


def check_schema(schema: object) -> dict:
    """The schema itself, or ``InvalidRequest`` (a ValueError) naming what is wrong with it (the host's mistake,
    not a model's)."""
    if not isinstance(schema, dict):
        raise InvalidRequest(INVALID_SCHEMA, "input_schema must be a JSON Schema object")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as error:
        raise InvalidRequest(INVALID_SCHEMA, f"input_schema is not a valid JSON Schema: {error.message}") from None
    return schema


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def require_input(schema: dict | None, body: str, peer: str) -> None:
    """Nothing to check without a schema; otherwise the body must be JSON matching it."""
    if schema is None:
        return
    try:
        value = json.loads(body)
    except ValueError:
        raise Rejected(
            Code.PEER_INPUT_MISMATCH,
            f"peer `{peer}` takes a JSON input matching its schema; `body` is not JSON",
        ) from None
    validator = validators.validator_for(schema)(schema, registry=LOCAL_ONLY)
    try:
        error = exceptions.best_match(validator.iter_errors(value))
    except Unresolvable as unresolvable:
        raise Rejected(
            Code.PEER_INPUT_MISMATCH, _bounded(f"peer `{peer}`'s schema has a reference that cannot be resolved "
                                               f"here ({unresolvable}); its host must fix the route"),
        ) from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the input)"
        raise Rejected(
            Code.PEER_INPUT_MISMATCH,
            _bounded(f"the input does not match peer `{peer}`'s schema at {where}: {error.message}"),
        )
