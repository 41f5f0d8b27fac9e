"""The content guards of a send (content blocks): size over every block, and the image check."""

from .. import blocks
from ..commands import SendArguments
from ..errors import Code, Rejected
from ..messaging import MessagingConfig
from ..records import SessionRecord
from .guards import Found, Target, require_body, require_recipient


def require_content(arguments: SendArguments, config: MessagingConfig) -> None:
    """A plain body by default; blocks only where the deployment turned them on, every block counted."""
    if arguments.blocks is None:
        require_body(arguments.body, config.max_body_bytes)
        return
    if not config.content_blocks:
        # A producer configured differently from the workers: the deployment's setting decides.
        raise Rejected(Code.INVALID_ARGUMENTS, "`body` must be a string: content blocks are off in this engine")
    if blocks.is_empty(arguments.blocks):
        raise Rejected(Code.INVALID_BODY, "body is empty; write the message in `body`")
    size = blocks.size(arguments.blocks)
    if size > config.max_body_bytes:
        raise Rejected(
            Code.INVALID_BODY,
            f"the message is {size} bytes counting every block (text, image data, URLs); the limit is "
            f"{config.max_body_bytes} bytes: shorten it or send fewer or smaller images",
        )


def require_image_capable(sender: SessionRecord, target: Target, arguments: SendArguments) -> Found:
    """Images only for a recipient whose model reads them; then the recipient is checked again.

    Exact recipient state: the capability is asserted, then the recipient's
    closing state is looked at once more before delivery. Here that second look is
    ``require_recipient`` run again after the capability check, on the same
    loaded state the commit's etag then pins: whatever refuses a closed or
    vanished recipient there refuses it here too, after the image check, and
    a recipient that changes before the commit makes the commit conflict and
    the whole decision run again.
    """
    found = require_recipient(sender, target)
    if blocks.has_image(arguments.blocks) and not found.record.accepts_images:
        raise Rejected(
            Code.MODEL_DOES_NOT_SUPPORT_IMAGES,
            f"{found.record.handle}'s model does not accept images; send the message as text "
            "(describe the image, or give a path or URL in the text)",
        )
    return require_recipient(sender, target)
