"""Tool definitions in the shapes agent frameworks use. Pure.

From the canonical definition (``name``, ``description``, ``input_schema``):

- ``anthropic``: Anthropic tool use, ``{"name", "description", "input_schema"}``.
- ``openai``: an OpenAI function tool (Chat Completions), ``{"type": "function", "function":
  {"name", "description", "parameters", "strict"}}``. ``strict`` is true when the
  schema can be written in strict mode: every object closed
  (``additionalProperties: false``), every property required, optional ones
  nullable (null then means "omitted": ``tools.call`` drops it), and only
  keywords strict mode accepts. Otherwise the schema is given as it is with
  ``strict: false``.
- ``mcp``: an MCP ``Tool``, ``{"name", "description", "inputSchema"}``.
"""

import copy

from treemail.domain import limits

FORMATS = ("anthropic", "openai", "mcp")

# Keywords OpenAI's strict mode accepts (Structured Outputs, "Supported schemas"); a schema using any
# other keyword (minLength, default, ...) keeps its full meaning with strict off rather than lose it.
STRICT_KEYWORDS = {
    "type", "description", "title", "properties", "required", "additionalProperties", "enum", "const",
    "anyOf", "items", "$ref", "$defs", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
}


def export(definitions: list[dict], fmt: str) -> list[dict]:
    if fmt not in FORMATS:
        raise limits.invalid(f"format must be one of {', '.join(FORMATS)}, got {limits.shown(fmt)}")
    return [_EXPORTERS[fmt](definition) for definition in definitions]


def anthropic_tool(definition: dict) -> dict:
    return {
        "name": definition["name"],
        "description": definition["description"],
        "input_schema": copy.deepcopy(definition["input_schema"]),
    }


def mcp_tool(definition: dict) -> dict:
    return {
        "name": definition["name"],
        "description": definition["description"],
        "inputSchema": copy.deepcopy(definition["input_schema"]),
    }


def openai_tool(definition: dict) -> dict:
    strict = strict_schema(definition["input_schema"])
    return {
        "type": "function",
        "function": {
            "name": definition["name"],
            "description": definition["description"],
            "parameters": strict if strict is not None else copy.deepcopy(definition["input_schema"]),
            "strict": strict is not None,
        },
    }


def strict_schema(schema: dict) -> dict | None:
    """The schema in OpenAI strict form, or None when strict mode cannot express it."""
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        return None
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    out = {k: v for k, v in schema.items() if k not in ("properties", "required")}
    out["properties"] = {}
    for name, prop in properties.items():
        prop = dict(prop)
        default = prop.pop("default", None)
        # Strict mode refuses minLength; treemail's own argument check enforces it (a stable error code),
        # so the export keeps its meaning in words and strict mode's guarantees for everything else.
        shortest = prop.pop("minLength", None)
        if shortest:
            prop["description"] = f"{prop.get('description', '').rstrip('.')}. Not empty.".lstrip(". ")
        if any(key not in STRICT_KEYWORDS for key in prop) or prop.get("type") in ("object", "array"):
            return None
        if name not in required:
            prop = _nullable(prop, default)
            if prop is None:
                return None
        out["properties"][name] = prop
    if any(key not in STRICT_KEYWORDS for key in out):
        return None
    out["required"] = list(properties)
    return out


def _nullable(prop: dict, default) -> dict | None:
    kind = prop.get("type")
    if not isinstance(kind, str):
        return None
    prop["type"] = [kind, "null"]
    if "enum" in prop:
        prop["enum"] = [*prop["enum"], None]
    note = "null: the default" + (f" ({default})" if default is not None else "")
    prop["description"] = f"{prop['description']} {note}." if prop.get("description") else f"{note[0].upper()}{note[1:]}."
    return prop


_EXPORTERS = {"anthropic": anthropic_tool, "openai": openai_tool, "mcp": mcp_tool}
