"""JSON Schema -> GBNF: llama-cpp-python's converter (a Python port of llama.cpp's json-schema-to-grammar) with
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

And where review found the port (or both converters) writing what the schema does not allow: a string's character
without raw control characters (llama.cpp's rule; a raw line break made the reply not JSON); a rule per $ref never
shared with another of the same last segment; a root property named ""; the type list ["integer", "null"] with
its bounds; allOf around one schema (pydantic's wrapper of a $ref), other non-object allOf refused; prefixItems
beside items as the tuple; a pattern checked as a regular expression, its escapes GBNF does not read (\\d, \\.)
written as classes, "." and [^...] without a quote, backslash or control character, the whole pattern inside the
string's quotes, lazy quantifiers as greedy, a quote or backslash it names written as JSON escapes them.
Keywords the grammar cannot hold (a number's bounds, multipleOf, uniqueItems, minProperties...) are not enforced,
as in llama.cpp.

Imported on first use (it loads llama_cpp, and so the libllama this package already uses)."""
from __future__ import annotations

import json
import math
import re
from typing import Any

from llama_cpp import llama_grammar

from .json_pattern import CLASS, DOT, SchemaError, converter_pattern, json_class  # noqa: F401 (SchemaError)

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


# a JSON string's character as llama.cpp's C++ converter writes it: no raw control character (the port allowed
# them: a reply with a raw line break in a string was not JSON, and a tool call in it was lost)
_CHAR = llama_grammar.BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', [])


class Converter(llama_grammar.SchemaConverter):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._ref_names: dict = {}  # $ref: its rule's name
        self._root_seen = False

    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)

    def _add_primitive(self, name, rule):
        return super()._add_primitive(name, _CHAR if name == "char" else rule)

    def _resolve_ref(self, ref):
        """A rule per $ref, named after its last segment but never after another's (the port reused any rule of
        that name: two tools' #/$defs/Item, a property named Item beside one, #/definitions/Item beside
        #/$defs/Item all got the first's grammar)."""
        if ref in self._ref_names:
            return self._ref_names[ref]
        base = llama_grammar.INVALID_RULE_CHARS_RE.sub("-", ref.split("/")[-1]) or "ref"
        base = base + "-" if base in llama_grammar.RESERVED_NAMES else base
        name, i = base, 0
        while name in self._rules or name in self._ref_names.values():
            i += 1
            name = f"{base}{i}"
        self._ref_names[ref] = name  # before visiting: a recursive schema names itself
        got = self.visit(self._refs[ref], name)
        if got != name:  # the visit named its rule otherwise: the name stands for it, unless another rule took it
            if name in self._rules:
                self._ref_names[ref] = got
                return got
            self._rules[name] = got
        return name

    def _visit_pattern(self, pattern, name):
        before = set(self._rules)
        rule = super()._visit_pattern(converter_pattern(pattern, name), name)
        for key in set(self._rules) - before:  # a class takes no character a JSON string must escape
            self._rules[key] = CLASS.sub(lambda m: json_class(m.group(0), name), self._rules[key])
        if "dot" in self._rules:
            self._rules["dot"] = DOT
        body = self._rules[rule]
        head, tail = '"\\"" ', ' "\\"" space'
        if body.startswith(head) and body.endswith(tail):  # the whole pattern, alternatives and all, in the quotes
            self._rules[rule] = head + "(" + body[len(head):-len(tail)] + ")" + tail
        return rule

    def visit(self, schema, name):
        if not name and self._root_seen:  # a property named "" of the root object: not the root
            name = "empty-key"
        self._root_seen = True
        rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        if schema is False:
            raise SchemaError(f"the schema at {name or 'the root'} is false: no JSON value matches it")
        if isinstance(schema, dict):
            schema = _drop_forbidden(schema, name)
            all_of = schema.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict) and \
                    not schema.keys() - ANNOTATIONS - {"allOf"}:  # pydantic's wrapper of a $ref with a description
                if not name:  # the root's own schema: still the root
                    self._root_seen = False
                return self.visit(all_of[0], name)
            if isinstance(all_of, list) and not all(
                    isinstance(t, dict) and ("properties" in t or "anyOf" in t or "$ref" in t) for t in all_of):
                raise SchemaError(f"the schema at {name or 'the root'}: allOf is supported for objects (each part "
                                  "with properties) or one schema alone")
            prefix = schema.get("prefixItems")
            if isinstance(prefix, list) and isinstance(schema.get("minItems", 0), int) and \
                    schema.get("minItems", 0) > len(prefix):
                raise SchemaError(f"the schema at {name or 'the root'}: prefixItems is written as a tuple of exactly "
                                  f"those items, and minItems {schema['minItems']} wants more")
            if isinstance(prefix, list) and "items" in schema:  # the tuple alone (the port took items, and dropped
                schema = {k: v for k, v in schema.items() if k != "items"}  # the tuple: [false] for [int, str])
        if allows_anything(schema):
            return self._add_rule(rule_name, self._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"]))
        if isinstance(schema, dict) and isinstance(schema.get("type"), list) and schema["type"]:
            # each type with the schema's other keywords (the port wrote the bare types: an integer's bounds, a
            # string's pattern were lost in ["integer", "null"], OpenAI's strict way to write an optional field)
            return self._add_rule(rule_name, " | ".join(
                self.visit(dict(schema, type=t), f"{name}{'-' if name else ''}{t}") for t in schema["type"]))
        if isinstance(schema, dict):
            _check_ranges(schema, name)
            if schema.get("type") == "integer" and schema.keys() & _BOUNDS and not schema.keys() & _BEFORE_BOUNDS:
                lo, hi = _int_bounds(schema, name)
                return self._add_rule(rule_name, "(" + int_range(lo, hi) + ") space")
        if isinstance(schema, dict) and schema.get("type") in (None, "array") and "items" in schema \
                and "prefixItems" not in schema and allows_anything(schema["items"]):
            item = self._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"])
            return self._add_rule(rule_name, '"[" space ' + llama_grammar._build_repetition(
                item, schema.get("minItems", 0), schema.get("maxItems"), separator_rule='"," space') + ' "]" space')
        return super().visit(schema, name)


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# what the converter reads before an integer's range (llama.cpp's order): a schema with one keeps its own way
_BEFORE_BOUNDS = ("enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if")
_INT64 = (-2**63, 2**63 - 1)


def _int_bounds(schema: dict, name: str) -> tuple:
    """An integer schema's (least, greatest) integer, None where unbounded: minimum 2.5 is 3, exclusiveMinimum 2 is
    3 (draft 6+: a number; draft 4's boolean beside minimum too)."""
    def number(key):
        v = schema.get(key)
        if v is None or isinstance(v, bool):
            return None
        if not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            raise SchemaError(f"the schema at {name or 'the root'}: {key} must be a finite number, got {v!r}")
        return v
    lo, hi = number("minimum"), number("maximum")
    lo = None if lo is None else math.ceil(lo) + (schema.get("exclusiveMinimum") is True and lo == math.ceil(lo))
    hi = None if hi is None else math.floor(hi) - (schema.get("exclusiveMaximum") is True and hi == math.floor(hi))
    xlo, xhi = number("exclusiveMinimum"), number("exclusiveMaximum")
    if xlo is not None:
        lo = max(lo, math.floor(xlo) + 1) if lo is not None else math.floor(xlo) + 1
    if xhi is not None:
        hi = min(hi, math.ceil(xhi) - 1) if hi is not None else math.ceil(xhi) - 1
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(f"the schema at {name or 'the root'} allows no integer (at least {lo}, at most {hi})")
    if (lo is not None and not _INT64[0] <= lo <= _INT64[1]) or (hi is not None and not _INT64[0] <= hi <= _INT64[1]):
        raise SchemaError(f"the schema at {name or 'the root'}: integer bounds beyond 64 bits are not supported")
    return lo, hi


def _check_ranges(schema: dict, name: str) -> None:
    """A length or count range that nothing fits (minLength 5, maxLength 2): the converter wrote a grammar of the
    minimum, which broke the maximum."""
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")):
        a, b = schema.get(low), schema.get(high)
        if isinstance(a, int) and isinstance(b, int) and a > b:
            raise SchemaError(f"the schema at {name or 'the root'} allows nothing: {low} {a} is more than {high} {b}")


MAX_DIGITS = 16  # an unbounded side allows integers of up to 16 digits, as llama.cpp's integral-part does


def int_range(lo, hi) -> str:
    """GBNF for the integers from lo to hi in decimal (None: unbounded on that side, not both), which
    llama-cpp-python's converter lacks (it ignored minimum and maximum: {"type": "integer", "minimum": 5} wrote 3)."""
    out: list = []
    if lo is not None and hi is not None:
        _min_max_int(lo, hi, out)
    elif lo is not None and lo < 0:  # -1 .. lo, then every natural number
        out.append('"-" (')
        _min_max_int(1, -lo, out)
        out.append(") | ")
        _from(0, out)
    elif lo is not None:
        _from(lo, out)
    elif hi is not None and hi >= 0:  # every negative number, then 0 .. hi
        out.append(f'"-" [1-9] [0-9]{{0,{MAX_DIGITS - 1}}} | ')
        _min_max_int(0, hi, out)
    elif hi is not None:
        out.append('"-" (')
        _from(-hi, out)
        out.append(")")
    else:
        raise SchemaError("an integer range needs a least or a greatest value")
    return "".join(out)


def _from(lo: int, out: list) -> None:
    """lo and every greater natural number: lo's digit count from lo up, then each longer count."""
    digits = len(str(lo))
    _min_max_int(lo, 10 ** digits - 1, out)
    most = max(MAX_DIGITS, digits)
    if digits < most:
        out.append(f" | [1-9] [0-9]{{{digits},{most - 1}}}")


def _min_max_int(lo: int, hi: int, out: list) -> None:
    """lo..hi, both given: llama.cpp's build_min_max_int for two ends (its one-ended cases are wrong: minimum 100
    took 10-19, minimum 10**17 wrote a count of {17,15}, which llama.cpp's parser met with bad_alloc)."""
    def digit_range(a: str, b: str) -> None:
        out.append(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more_digits(n: int) -> None:  # n digits
        out.append("[0-9]" if n == 1 else f"[0-9]{{{n}}}")

    def uniform_range(a: str, b: str) -> None:
        i = 0
        while i < len(a) and i < len(b) and a[i] == b[i]:
            i += 1
        if i > 0:
            out.append(f'"{a[:i]}"')
        if i < len(a) and i < len(b):
            if i > 0:
                out.append(" ")
            sub_len = len(a) - i - 1
            if sub_len > 0:
                a_sub, b_sub = a[i + 1:], b[i + 1:]
                zeros, nines = "0" * sub_len, "9" * sub_len
                to_reached = False
                out.append("(")
                if a_sub == zeros:
                    digit_range(a[i], chr(ord(b[i]) - 1))
                    out.append(" ")
                    more_digits(sub_len)
                else:
                    out.append(f"[{a[i]}] (")
                    uniform_range(a_sub, nines)
                    out.append(")")
                    if ord(a[i]) < ord(b[i]) - 1:
                        out.append(" | ")
                        if b_sub == nines:
                            digit_range(chr(ord(a[i]) + 1), b[i])
                            to_reached = True
                        else:
                            digit_range(chr(ord(a[i]) + 1), chr(ord(b[i]) - 1))
                        out.append(" ")
                        more_digits(sub_len)
                if not to_reached:
                    out.append(" | ")
                    digit_range(b[i], b[i])
                    out.append(" ")
                    uniform_range(zeros, b_sub)
                out.append(")")
            else:
                out.append(f"[{a[i]}-{b[i]}]")

    if lo < 0 and hi < 0:
        out.append('"-" (')
        _min_max_int(-hi, -lo, out)
        out.append(")")
        return
    if lo < 0:
        out.append('"-" (')
        _min_max_int(0, -lo, out)
        out.append(") | ")
        lo = 0
    lo_s, hi_s = str(lo), str(hi)
    for digits in range(len(lo_s), len(hi_s)):
        uniform_range(lo_s, "9" * digits)
        lo_s = "1" + "0" * digits
        out.append(" | ")
    uniform_range(lo_s, hi_s)


def _drop_forbidden(schema: dict, name: str) -> dict:
    """The schema without its properties of false (a key that must not appear, left out of the object) and with an
    array's items of false read as "no more items" (an empty array, or the prefixItems tuple alone)."""
    props = schema.get("properties")
    if isinstance(props, dict) and any(v is False for v in props.values()):
        banned = [k for k, v in props.items() if v is False]
        required = [k for k in banned if k in (schema.get("required") or [])]
        if required:
            raise SchemaError(f"the schema at {name or 'the root'} requires property {required[0]!r}, whose schema "
                             f"is false: no JSON value matches it")
        if schema.get("additionalProperties") not in (None, False):  # the key could come back as an additional one
            raise SchemaError(f"the schema at {name or 'the root'}: a property of false ({banned[0]!r}) beside "
                             f"additionalProperties is not supported; leave the property out")
        schema = dict(schema, properties={k: v for k, v in props.items() if v is not False})
    is_array = schema.get("type") == "array" or (schema.get("type") is None and not schema.keys() & {
        "properties", "additionalProperties", "required"})
    if schema.get("items") is False and is_array:
        prefix = schema.get("prefixItems") or []
        if schema.get("minItems", 0) > len(prefix):
            raise SchemaError(f"the schema at {name or 'the root'} wants at least {schema['minItems']} items but "
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
