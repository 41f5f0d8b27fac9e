"""What a send's caller is answered when no decision could be had: shared by producers and workers."""

from .errors import Code


def error_result(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def engine_shutdown(reason: str) -> dict:
    return error_result(
        Code.ENGINE_SHUTDOWN.value,
        f"{reason}; the message may or may not have been accepted. Retrying this same tool call is safe: "
        "it is delivered at most once.",
    )
