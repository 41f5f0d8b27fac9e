"""Content blocks: a message that is more than text (``message: ContentBlock[]``). Pure.

A block is text, or an image given either inline (a media type and base64
data) or by URL. The model writes them as JSON objects:

    {"type": "text", "text": "the chart:"}
    {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo..."}
    {"type": "image", "url": "https://example.com/chart.png"}

A block message is stored with its blocks, and with a ``body`` that is its
text where each image stands as ``[image N]``: history, tail and an approval
request show where the images were, and the envelope renders that text as it
renders any body, while the images travel beside it as the host's image parts.
"""

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import TreemailError

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MAX_BLOCKS = 64


@dataclass(frozen=True)
class TextBlock:
    text: str


@dataclass(frozen=True)
class ImageBlock:
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


Block = TextBlock | ImageBlock


class InvalidBlocks(TreemailError, ValueError):
    """The model's blocks cannot be a message; the text says which block and how to fix it."""

    code = "send_message:invalid_arguments"


def _is_text(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _strict(raw: Mapping, where: str, required: set[str], optional: set[str]) -> None:
    unknown = sorted(str(k) for k in raw if k not in required | optional)
    if unknown:
        raise InvalidBlocks(f"{where}: unknown field(s) {', '.join(unknown)}")
    for name in sorted(required):
        if name not in raw:
            raise InvalidBlocks(f"{where}: missing `{name}`")
    for name in raw:
        if not _is_text(raw[name]):
            raise InvalidBlocks(f"{where}: `{name}` must be a string")


def _parse_one(raw, index: int) -> Block:
    where = f"block {index + 1}"
    if not isinstance(raw, Mapping):
        raise InvalidBlocks(f"{where} must be an object with a `type`")
    kind = raw.get("type")
    if kind == "text":
        _strict(raw, where, {"type", "text"}, set())
        return TextBlock(raw["text"])
    if kind != "image":
        raise InvalidBlocks(f"{where}: `type` must be \"text\" or \"image\"")
    if "url" in raw:
        _strict(raw, where, {"type", "url"}, {"media_type"})
        if not raw["url"].startswith(("https://", "http://")) or any(c.isspace() for c in raw["url"]):
            raise InvalidBlocks(f"{where}: `url` must be an http(s) URL")
        media_type = raw.get("media_type")
    else:
        _strict(raw, where, {"type", "media_type", "data"}, set())
        media_type = raw["media_type"]
        try:
            base64.b64decode(raw["data"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidBlocks(f"{where}: `data` must be base64 (no data: prefix, no line breaks)") from None
        if not raw["data"]:
            raise InvalidBlocks(f"{where}: `data` is empty")
    if media_type is not None and media_type not in MEDIA_TYPES:
        raise InvalidBlocks(f"{where}: `media_type` must be one of {', '.join(MEDIA_TYPES)}")
    return ImageBlock(media_type, raw.get("data"), raw.get("url"))


def parse_blocks(raw: Sequence) -> tuple[Block, ...]:
    if not raw:
        raise InvalidBlocks("`body` has no blocks: give at least one text or image block")
    if len(raw) > MAX_BLOCKS:
        raise InvalidBlocks(f"`body` has {len(raw)} blocks; at most {MAX_BLOCKS} are allowed")
    return tuple(_parse_one(item, i) for i, item in enumerate(raw))


def size(blocks: Sequence[Block]) -> int:
    """What the size limit counts: every block's text, inline data and URL, in UTF-8 bytes."""
    total = 0
    for block in blocks:
        if isinstance(block, TextBlock):
            total += len(block.text.encode("utf-8"))
        else:
            total += len((block.data or "").encode()) + len((block.url or "").encode("utf-8"))
    return total


def is_empty(blocks: Sequence[Block]) -> bool:
    return not any(isinstance(b, ImageBlock) or b.text for b in blocks)


def has_image(blocks: Sequence[Block] | None) -> bool:
    return any(isinstance(b, ImageBlock) for b in blocks or ())


def text_of(blocks: Sequence[Block]) -> str:
    """The message's text, an ``[image N]`` marker where each image stands."""
    parts, images = [], 0
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        else:
            images += 1
            parts.append(f"[image {images}]")
    return "\n\n".join(parts)


def to_json(blocks: Sequence[Block]) -> list[dict]:
    out = []
    for block in blocks:
        if isinstance(block, TextBlock):
            out.append({"type": "text", "text": block.text})
        else:
            fields = {"media_type": block.media_type, "data": block.data, "url": block.url}
            out.append({"type": "image", **{k: v for k, v in fields.items() if v is not None}})
    return out


def from_json(raw: Sequence[Mapping]) -> tuple[Block, ...]:
    """Blocks as stored (already validated when they were accepted)."""
    return tuple(
        TextBlock(b["text"]) if b["type"] == "text" else ImageBlock(b.get("media_type"), b.get("data"), b.get("url"))
        for b in raw
    )


def fingerprint_part(blocks: Sequence[Block] | None) -> list:
    """What a fingerprint adds for blocks: nothing for a plain message, so older fingerprints still match."""
    return [] if not blocks else [json.dumps(to_json(blocks), sort_keys=True, separators=(",", ":"))]


def image_parts(raw: Sequence[Mapping] | None) -> list[dict]:
    """The images of a stored message as the host's image parts, in order, numbered like their markers."""
    images = [b for b in raw or () if b.get("type") == "image"]
    return [{**{k: v for k, v in b.items()}, "index": i} for i, b in enumerate(images, start=1)]
