"""The receiving tools of an agent that speaks only MCP: what its model reads (definitions, results, errors).

They are served by an MCP connection that is the agent itself (``producers/mcp/connection.py``), beside
the session's tools of ``table.py``: receiving belongs to the connection (it holds the claims its
results handed out), not to the session, so they are not rows of the session's tool table.
"""

CHECK_MAIL = "check_mail"
WAIT_FOR_MAIL = "wait_for_mail"
ACKNOWLEDGE_MAIL = "acknowledge_mail"
NAMES = (CHECK_MAIL, WAIT_FOR_MAIL, ACKNOWLEDGE_MAIL)

# A wait holds one request open; longer than a minute and clients' own request timeouts start to bite.
MAX_WAIT_S = 60
DEFAULT_WAIT_S = 30

_RECEIPT = (
    " Each message arrives in an <agent_message> envelope naming its sender. Your next call of any "
    "treemail tool confirms you have read them; if you stop before that, they come back later, marked as "
    "shown before."
)

DEFINITIONS = {
    CHECK_MAIL: {
        "name": CHECK_MAIL,
        "description": "Take the messages other agents sent you since your last check (returns at once)." + _RECEIPT,
        "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    },
    WAIT_FOR_MAIL: {
        "name": WAIT_FOR_MAIL,
        "description": (
            f"Wait for messages, at most timeout_s seconds (default {DEFAULT_WAIT_S}, at most {MAX_WAIT_S}), and "
            "take them as check_mail does; returns as soon as one arrives." + _RECEIPT
        ),
        "input_schema": {
            "type": "object",
            "properties": {"timeout_s": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S}},
            "additionalProperties": False,
        },
    },
    ACKNOWLEDGE_MAIL: {
        "name": ACKNOWLEDGE_MAIL,
        "description": (
            "Confirm you have read the messages your last check returned. Only needed when that check is "
            "your last treemail call before you stop: any other call confirms them too."
        ),
        "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}

NO_MAIL = "No new messages."


def error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def parse(name: str, arguments) -> float | dict:
    """The wait in seconds (0 for check_mail), or an ``invalid_arguments`` error result."""
    if not isinstance(arguments, dict) or set(arguments) - set(DEFINITIONS[name]["input_schema"]["properties"]):
        return error(f"{name}:invalid_arguments", f"{name} takes {_takes(name)}")
    if name != WAIT_FOR_MAIL:
        return 0.0
    # null is absent, as for every optional argument (OpenAI's strict mode sends null for one not given).
    timeout = arguments.get("timeout_s")
    timeout = DEFAULT_WAIT_S if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 <= timeout <= MAX_WAIT_S:
        return error(f"{name}:invalid_arguments", f"timeout_s must be a whole number of seconds from 0 to {MAX_WAIT_S}")
    return float(timeout)


def _takes(name: str) -> str:
    return "optionally timeout_s (seconds)" if name == WAIT_FOR_MAIL else "no arguments"


# The steer mail that rides on another tool's structured result (beside the tool's own fields).
AGENT_MESSAGES = "agent_messages"


def message_row(delivery) -> dict:
    """``shown_before`` only for a repeat (how many results carried it, unconfirmed): news reads as it always did.
    ``images``: a message with images has them here as its delivery's image parts (``[image N]`` in its text
    says where each stood), so a client that reads the structured result shows them too."""
    row = {"message_id": delivery.message_id, "owner": delivery.owner, "mode": delivery.mode,
           "sender_session_id": delivery.sender_session_id, "text": delivery.text}
    if delivery.shown_before:
        row["shown_before"] = delivery.shown_before
    images = [dict(part) for part in delivery.parts if part.get("type") == "image"]
    if images:
        row["images"] = images
    return row


def mail_result(deliveries) -> dict:
    return {"messages": [message_row(d) for d in deliveries]}


def riding(result: dict, deliveries) -> dict:
    """A tool's own structured result with the steer mail due at its call, the same rows check_mail returns.

    The mail rides in the structured result as well as in the text: a client that reads only one of them
    (the OpenAI Agents SDK with ``use_structured_content`` shows its model the structured result alone)
    would otherwise never show the message, and the next call would still confirm it read.
    """
    if not deliveries:
        return result
    return {**result, AGENT_MESSAGES: [message_row(d) for d in deliveries]}


def result_text(result: dict, threads: bool = False) -> str:
    """``threads``: each envelope is followed by its message id, which ``in_reply_to`` names to answer it."""
    if "error" in result:
        return f"{result['error']['code']}: {result['error']['message']}"
    if "acknowledged" in result:
        return f"{result['acknowledged']} message(s) confirmed read."
    texts = [m["text"] + (f"\n(message_id: {m['message_id']})" if threads else "") for m in result["messages"]]
    return "\n\n".join(texts) if texts else NO_MAIL
