"""A send's fields, checked once the tool has vetted the shape of the model's object. Pure.

The tool (``producers/tools/send_message``) refuses what is wrong with the
object itself (not an object, an unknown or renamed key, a bad `urgent` or
`in_reply_to`); everything after that is judged here, in the order a model
reads its mistakes: the body's blocks, then `to` and `body`, `mode`, `to`'s
length, a blank body, and the model's send options. The size of the body
waits for ``require_storable``, which needs the deployment's settings.
"""

from .. import blocks, limits
from ..commands import SendArguments
from ..errors import Code, Rejected
from ..messaging import MessagingConfig
from .content import require_content
from .guards import require_not_blank
from .mailcontrol import with_send_options

MODES = ("steer", "queue")
URGENT = "urgent"
EXPIRES = "expires_in_s"
SUPERSEDE = "supersede_key"


def invalid(message: str) -> Rejected:
    return Rejected(Code.INVALID_ARGUMENTS, message)


def is_unicode_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def send_fields(raw: dict, content_blocks: bool, in_reply_to: str | None) -> SendArguments:
    """The model's send as ``SendArguments``: ``raw`` is its object with only allowed keys, ``in_reply_to``
    already checked; with ``content_blocks`` (the deployment's setting) ``body`` may be a list of blocks."""
    parsed_blocks = None
    if content_blocks and isinstance(raw.get("body"), list):
        try:
            parsed_blocks = blocks.parse_blocks(raw["body"])
        except blocks.InvalidBlocks as error:
            raise invalid(str(error)) from None
        raw = {**raw, "body": blocks.text_of(parsed_blocks)}
    for name in ("to", "body"):
        if name not in raw:
            raise invalid(f"missing required argument `{name}`")
        if not isinstance(raw[name], str):
            raise invalid(f"`{name}` must be a string")
        if not is_unicode_text(raw[name]):
            # A JSON "\ud800" escape decodes to a lone surrogate, which no UTF-8 store or byte count accepts.
            raise invalid(f"`{name}` is not valid Unicode text (it contains a lone surrogate)")
    mode = raw.get("mode", "steer")
    if mode not in MODES:
        raise invalid("`mode` must be \"steer\" or \"queue\"")
    if not raw["to"].strip():
        raise invalid("`to` is empty: give the recipient's handle or session id")
    if limits.byte_length(raw["to"]) > limits.MAX_ID_BYTES:
        # A handle or a session id is short: a longer `to` names no session, and is refused before it is stored.
        raise invalid(f"`to` is over {limits.MAX_ID_BYTES} bytes: give the recipient's handle or session id")
    # The arguments are well formed; a blank body is the one body check that needs no settings.
    # (Content blocks are judged whole, every block counted, by the decider's content guard.)
    if parsed_blocks is None:
        require_not_blank(raw["body"])
    parsed = SendArguments(to=raw["to"].strip(), body=raw["body"], mode=mode, blocks=parsed_blocks,
                           in_reply_to=in_reply_to.strip() if in_reply_to else None, urgent=raw.get(URGENT, False))
    if raw.get(EXPIRES) is not None or raw.get(SUPERSEDE) is not None:
        parsed = with_send_options(parsed, raw.get(EXPIRES), raw.get(SUPERSEDE))
    return parsed


def require_storable(arguments: SendArguments, config: MessagingConfig) -> None:
    """Refuse, before anything is stored, a body every worker would refuse for its size.

    The decision checks it again (a worker may run another configuration);
    this check only keeps a 10 MB body out of the command stream. Messaging
    that is disabled is left to the decision, whose code says so.
    """
    if config.enabled and (arguments.body or arguments.blocks):
        require_content(arguments, config)  # every content block counted, as the decision does
