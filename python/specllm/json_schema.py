"""JSON Schema -> GBNF: llama-cpp-python's converter (a Python port of llama.cpp's json-schema-to-grammar) with three
places mended where it parts from llama.cpp's C++ converter, which llama-server uses:

- a literal's backslash is escaped. The port escapes only CR, LF and '"', so a schema's "C:\\dir" (enum, const, a
  property's name) came out as `"C:\\dir"` in GBNF, which llama.cpp reads as `"C:\\dir"` with one backslash: invalid
  JSON, a \\u0000 escape became a raw NUL that cut the output, and a '"' in a property's name made the grammar
  unparsable;
- a schema that allows anything ({} or true, or one with only annotations such as a description: pydantic's Any)
  is any JSON value (a reply format's root excepted: grammar.response_format), where the port made it an object,
  so `list[Any]` ({"type": "array", "items": {}}) failed with KeyError 'prefixItems' and additional properties had
  to be objects;
- a schema of false is refused with a message, not an AttributeError; where JSON Schema uses false to forbid (a
  property of false: the property must not appear; items of false: no items beyond prefixItems) it forbids.

Imported on first use (it loads llama_cpp, and so the libllama this package already uses)."""
from __future__ import annotations

import json
import re
from typing import Any

from llama_cpp import llama_grammar

# keys that say nothing about which values match
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated",
                         "readOnly", "writeOnly"})
_LITERAL_ESCAPE = re.compile(r'[\r\n\t"\\]')  # llama.cpp's GRAMMAR_LITERAL_ESCAPE_RE, and tabs
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", "\t": "\\t", '"': '\\"', "\\": "\\\\"}


def gbnf_literal(text: str) -> str:
    """text as a GBNF string literal: backslashes, quotes, CR, LF and tabs escaped."""
    return '"' + _LITERAL_ESCAPE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], text) + '"'


def allows_anything(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and not schema.keys() - ANNOTATIONS)


class Converter(llama_grammar.SchemaConverter):
    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)

    def visit(self, schema, name):
        rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        if schema is False:
            raise ValueError(f"the schema at {name or 'the root'} is false: no JSON value matches it")
        if isinstance(schema, dict):
            schema = _drop_forbidden(schema, name)
        if allows_anything(schema):
            return self._add_rule(rule_name, self._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"]))
        if isinstance(schema, dict) and schema.get("type") in (None, "array") and "items" in schema \
                and "prefixItems" not in schema and allows_anything(schema["items"]):
            item = self._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"])
            return self._add_rule(rule_name, '"[" space ' + llama_grammar._build_repetition(
                item, schema.get("minItems", 0), schema.get("maxItems"), separator_rule='"," space') + ' "]" space')
        return super().visit(schema, name)


def _drop_forbidden(schema: dict, name: str) -> dict:
    """The schema without its properties of false (a key that must not appear, left out of the object) and with an
    array's items of false read as "no more items" (an empty array, or the prefixItems tuple alone)."""
    props = schema.get("properties")
    if isinstance(props, dict) and any(v is False for v in props.values()):
        banned = [k for k, v in props.items() if v is False]
        required = [k for k in banned if k in (schema.get("required") or [])]
        if required:
            raise ValueError(f"the schema at {name or 'the root'} requires property {required[0]!r}, whose schema "
                             f"is false: no JSON value matches it")
        if schema.get("additionalProperties") not in (None, False):  # the key could come back as an additional one
            raise ValueError(f"the schema at {name or 'the root'}: a property of false ({banned[0]!r}) beside "
                             f"additionalProperties is not supported; leave the property out")
        schema = dict(schema, properties={k: v for k, v in props.items() if v is not False})
    is_array = schema.get("type") == "array" or (schema.get("type") is None and not schema.keys() & {
        "properties", "additionalProperties", "required"})
    if schema.get("items") is False and is_array:
        prefix = schema.get("prefixItems") or []
        if schema.get("minItems", 0) > len(prefix):
            raise ValueError(f"the schema at {name or 'the root'} wants at least {schema['minItems']} items but "
                             f"allows {len(prefix)} (items is false)")
        schema = {k: v for k, v in schema.items() if k != "items"}
        if not prefix:
            schema = dict(schema, const=[])
        else:
            schema = dict(schema, prefixItems=prefix)
    return schema


def to_gbnf(schema: Any) -> str:
    """GBNF for a JSON Schema (a dict, true or false), as llama_grammar.json_schema_to_gbnf makes it but with the
    converter above. Raises what the converter raises (ValueError, KeyError, ...) for what it cannot express."""
    converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = converter.resolve_refs(json.loads(json.dumps(schema)), "stdin")
    converter.visit(schema, "")
    return converter.format_grammar()
