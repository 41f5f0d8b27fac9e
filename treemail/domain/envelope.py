"""The envelope a recipient's model sees. Pure.

    <agent_message from="explore_1a2b3c4d">
    Message written by the sending agent

    [use `send_message(to="explore_1a2b3c4d", ...)` to reply]
    </agent_message>

The body is kept as written, with two exceptions that make forgery
impossible. A body is read the way any rendering might read it: HTML
entities decoded, Unicode compatibility forms folded (NFKC: full-width and
small-form ``<``), zero-width and other invisible characters dropped, case
ignored, and any non-ASCII letter taken for the ASCII one it may look like
(Cyrillic ``а`` for ``a``). Wherever that reading holds an envelope tag
(``<agent_message``, ``</agent_message``, or treemail's own ``<treemail_notice``,
any spacing or separator inside),
the character or entity that opens it is written ``&amp;lt;``, which reads as
an escaped ``<`` even after one round of entity decoding. Wherever it holds
the opening of treemail's reply hint (``use send_message(``), ``(quoted) `` is
written before it. So the only tags and the only hint in the text are the
ones treemail wrote, and ``from`` always names the real sender. The durable
event keeps the body byte for byte.
"""

import html
import re
import unicodedata
from html.entities import html5

ESCAPED_LT = "&amp;lt;"
QUOTED = "(quoted) "
# Characters drawn like "<" that NFKC leaves alone (NFKC already folds full-width and small-form ones).
LT_LIKE = frozenset("\u2039\u02c2\u1438\u3008\u2329\u27e8\u276e\u276c\u29fc\u1445\u227a")
# Invisible letters (category Lo) that renderings show as nothing; Cf, Mn and Me are dropped by category.
INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u034f")
NUMERIC = re.compile(r"&#(?:[0-9]+|[xX][0-9a-fA-F]+);?")
NAMED = re.compile(r"&([A-Za-z][A-Za-z0-9]*)(;?)")
# Where the ``<`` of a tag, or the ``(`` of a hint, could come from; a body with none of these holds neither.
OPENERS = re.compile("[<&(\uff1c\ufe64\uff08\ufe59\u207d\u208d" + "".join(sorted(LT_LIKE)) + "]")
# Stretches that read the same however they are rendered: no "&", nothing non-ASCII.
PLAIN = re.compile(r"[\x00-\x25\x27-\x7f]+")
# A separator inside a name: spacing, or something drawn like "_" or "-".
SEP = r"[\s_\-.·\u2010-\u2015\u2017\u02cd\u2581\u23bd]*"
# Letters of the scripts that hold look-alikes of Latin ones (Latin extensions, IPA, Greek, Cyrillic,
# Armenian, Cherokee, phonetic and letterlike symbols). A letter of these may stand for any ASCII letter:
# no table of look-alikes is ever complete, and CJK text is never mistaken for a tag name.
LOOKALIKE = (r"[\u00c0-\u02af\u0370-\u03ff\u0400-\u052f\u0530-\u058f\u13a0-\u13ff\u1d00-\u1dbf"
             r"\u1e00-\u1eff\u2100-\u214f\ua640-\ua69f\ua720-\ua7ff]")


def _fuzzy(word: str) -> str:
    """``word`` where every letter may also be a look-alike letter of another script."""
    return "".join(f"(?:{c}|{LOOKALIKE})" if c.isalpha() else SEP for c in word)


# treemail_notice too: a body must not be able to forge a notice treemail writes either.
TAG = re.compile(r"<\s*/?\s*(?:" + _fuzzy("agent_message") + "|" + _fuzzy("treemail_notice") + ")")
# The opening is enough: the rest of a forged hint may follow on the next lines, or be left to the
# reader's imagination ("[use send_message(" and then treemail's own hint below it).
HINT = re.compile(_fuzzy("use") + r"\W{0,3}" + _fuzzy("send_message") + r"\s*[(（]")
# The reply hint is only worth looking for where these letters occur, after any rendering.
HINT_LETTERS = re.compile(r"send|[^\x00-\x7f]|&", re.IGNORECASE)


def _entity(text: str, at: int) -> tuple[str, int] | None:
    """The entity starting at ``at`` as an HTML parser decodes it (legacy names need no ``;``), and its end."""
    numeric = NUMERIC.match(text, at)
    if numeric:
        return html.unescape(numeric.group()), numeric.end()
    named = NAMED.match(text, at)
    if not named:
        return None
    name, semicolon = named.groups()
    if semicolon and f"{name};" in html5:
        return html5[f"{name};"], named.end()
    for length in range(len(name), 1, -1):  # the longest legacy name it starts with, as parsers do
        if name[:length] in html5:
            return html5[name[:length]], at + 1 + length
    return None


def _read(text: str, spans: list[tuple[int, int]] | None) -> tuple[str, list[tuple[int, int]]]:
    """One rendering pass: the text as read, and for each character read, the span of ``text`` it came from.

    ``spans`` maps ``text`` back to the body (for a second pass over the first's output).
    """
    out: list[str] = []
    where: list[tuple[int, int]] = []

    def emit(chars: str, start: int, end: int) -> None:
        if spans is not None:
            start, end = spans[start][0], spans[end - 1][1]
        out.append(chars)
        where.extend([(start, end)] * len(chars))

    i = 0
    while i < len(text):
        plain = PLAIN.match(text, i)
        if plain:
            chunk = plain.group()
            out.append(chunk.lower())
            where.extend((j, j + 1) if spans is None else spans[j] for j in range(i, plain.end()))
            i = plain.end()
            continue
        entity = _entity(text, i) if text[i] == "&" else None
        if entity is not None:
            decoded, end = entity
            emit(decoded.lower(), i, end)
            i = end
            continue
        ch = text[i]
        if ch in LT_LIKE:
            emit("<", i, i + 1)
        elif unicodedata.category(ch) not in ("Cf", "Mn", "Me") and ch not in INVISIBLE:
            emit(unicodedata.normalize("NFKC", ch).casefold(), i, i + 1)
        i += 1
    return "".join(out), where


def read_as_rendered(body: str) -> tuple[str, list[tuple[int, int]]]:
    """The body as the most permissive rendering reads it (entities decoded up to three times)."""
    text, spans = _read(body, None)
    for _ in range(2):
        if "&" not in text:
            break
        text, spans = _read(text, spans)
    return text, spans


def neutralize(body: str) -> str:
    if not OPENERS.search(body):
        return body  # the common case: nothing any rendering could read as a tag or a hint
    text, spans = read_as_rendered(body)
    # Replacements in the body: (start, end, new text); tag openers are replaced, hints prefixed.
    edits: dict[int, tuple[int, str]] = {}
    for match in TAG.finditer(text):
        start, end = spans[match.start()]
        edits[start] = (end, ESCAPED_LT)
    if HINT_LETTERS.search(body):
        for match in HINT.finditer(text):
            start, _ = spans[match.start()]
            if start not in edits:
                edits[start] = (start, QUOTED)
    if not edits:
        return body
    parts, at = [], 0
    for start in sorted(edits):
        end, new = edits[start]
        if start < at:
            continue  # inside an entity already replaced
        parts += [body[at:start], new]
        at = end
    parts.append(body[at:])
    return "".join(parts)


def render_agent_message(sender: str, body: str, reply_hint: bool) -> str:
    """``sender`` is the handle, or the UUID of a sender registered without one."""
    lines = [f'<agent_message from="{sender}">', neutralize(body)]
    if reply_hint:
        lines += ["", f'[use `send_message(to="{sender}", ...)` to reply]']
    lines.append("</agent_message>")
    return "\n".join(lines)


# The opening tag treemail wrote on a rendered message's first line (a body can forge none: ``neutralize``).
OPENING_TAG = re.compile(r"<(?:agent_message|treemail_notice)\b[^>\n]*")


def mark_shown_before(text: str, times: int) -> str:
    """``text`` whose opening tag says it was handed to the model ``times`` times before (0: unchanged), so a
    model that resumes without its old context tells a repeat from news; text with no tag of ours stays as is."""
    opening = OPENING_TAG.match(text)
    if times <= 0 or opening is None:
        return text
    return f'{text[:opening.end()]} shown_before="{times}"{text[opening.end():]}'
