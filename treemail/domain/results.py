"""What a send's caller is answered when no decision could be had: shared by producers and workers."""

from .errors import MAX_MESSAGE_CHARS, Code


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[:max(limit - 1, 0)] + "…"


def error_result(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": clip(message, MAX_MESSAGE_CHARS)}}


def engine_shutdown(reason: str) -> dict:
    return error_result(
        Code.ENGINE_SHUTDOWN.value,
        f"{reason}; the message may or may not have been accepted. Retrying this same tool call is safe: "
        "it is delivered at most once.",
    )


def approval_timeout(request_id: str, waited_s: float) -> dict:
    return error_result(
        Code.APPROVAL_TIMEOUT.value,
        f"nobody answered approval request {request_id} within {waited_s:g} s, so nothing was sent. The "
        "request stays open: if a person approves it later, retrying this same tool call sends the message.",
    )
