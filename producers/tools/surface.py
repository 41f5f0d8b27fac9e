"""How send_message's surface changes with the deployment (direct routing, content blocks). Pure.

The default surface is the plain send_message tool's (``send_message.py``). ``[messaging]
routing = "direct"`` changes what ``to`` may name and says so;
``content_blocks = true`` lets ``body`` be a list of blocks and says so.
"""

from treemail.domain import blocks

DIRECT_DESCRIPTION = (
    "Send a message to a direct neighbour: your direct continuable child, or your direct parent when you are a "
    "resident continuable child. No other agent can be addressed. `to` is that agent's handle (like "
    "explore_1a2b3c4d) or full session id. `mode` is `steer` (default: the message joins the recipient's "
    "current work at its next step) or `queue` (it becomes the recipient's next turn). A finished agent is woken "
    "by a message. Success means the message is durably accepted, not that it was read; replies arrive as new "
    "messages, so never poll."
)
DIRECT_TO = (
    "The handle or session id of your direct continuable child, or of your direct parent when you are a resident "
    "continuable child."
)
BLOCKS_SENTENCE = (
    " `body` is a string, or a list of content blocks: {\"type\": \"text\", \"text\": ...}, "
    "{\"type\": \"image\", \"media_type\": \"image/png\", \"data\": \"<base64>\"} or "
    "{\"type\": \"image\", \"url\": \"https://...\"}. Images reach only agents whose model accepts images; "
    "the size limit counts every block."
)

_TEXT = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
    "additionalProperties": False,
}
_IMAGE_DATA = {
    "type": "object",
    "properties": {
        "type": {"const": "image"},
        "media_type": {"type": "string", "enum": list(blocks.MEDIA_TYPES)},
        "data": {"type": "string", "contentEncoding": "base64"},
    },
    "required": ["type", "media_type", "data"],
    "additionalProperties": False,
}
_IMAGE_URL = {
    "type": "object",
    "properties": {
        "type": {"const": "image"},
        "url": {"type": "string", "format": "uri"},
        "media_type": {"type": "string", "enum": list(blocks.MEDIA_TYPES)},
    },
    "required": ["type", "url"],
    "additionalProperties": False,
}


def direct_routing(to: dict, description: str) -> tuple[dict, str]:
    return {**to, "description": DIRECT_TO}, DIRECT_DESCRIPTION


def content_blocks(body: dict, description: str) -> tuple[dict, str]:
    schema = {
        "description": "The message, as the recipient should read it: a string, or a list of text and image blocks.",
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "maxItems": blocks.MAX_BLOCKS,
             "items": {"anyOf": [_TEXT, _IMAGE_DATA, _IMAGE_URL]}},
        ],
    }
    return schema, description + BLOCKS_SENTENCE

