"""Grammars for constrained output: GBNF text for LLM.generate(..., grammar=...). The target's rows are masked by
the grammar as they are verified, so drafting goes on as before: a draft is cut at its first token the grammar
forbids, and greedy output is the constrained greedy output (cpp/include/specllm/grammar.h).

JSON and JSON Schema become GBNF through llama-cpp-python's converter (llama.cpp's json-schema-to-grammar, the one
llama-cpp-python's server uses), with the few places where it parts from llama.cpp's C++ converter mended
(json_schema.py): the same rules users of llama.cpp get."""
from __future__ import annotations

import json as _json
import re
from typing import Any, Optional, Union

from .errors import InvalidOptionError


def json(schema: Optional[Union[dict, bool, str]] = None) -> str:
    """GBNF for a JSON object (schema None, as OpenAI's response_format {"type": "json_object"}), or for JSON
    following `schema` (a JSON Schema as a dict, or as JSON text). InvalidOptionError when the schema is not JSON or
    uses what the converter cannot express."""
    from llama_cpp import llama_grammar  # loads the libllama this package already uses

    from . import json_schema

    if schema is None:
        return llama_grammar.JSON_GBNF
    if isinstance(schema, str):
        try:
            schema = _json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise InvalidOptionError(f"the JSON schema is not JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidOptionError(f"a JSON schema is an object (or true/false), got {type(schema).__name__}")
    _check_counts(schema, "schema")
    try:
        return json_schema.to_gbnf(_inline_root_ref(schema))
    except RecursionError:
        raise InvalidOptionError("the JSON schema nests deeper than the converter can follow; flatten it") from None
    except Exception as e:  # the converter raises what it meets: ValueError, KeyError, AssertionError, ...
        raise InvalidOptionError(_converter_error(e, schema)) from None


_DANGLING_REF = re.compile(r"^Error resolving ref (?:stdin)?(#[^:]*):")


def _pointer(schema: Any, ref: str) -> Any:
    """What a local $ref ("#/$defs/a", JSON Pointer escapes ~0 and ~1) names in the schema, or None."""
    if not ref.startswith("#/"):
        return None
    node = schema
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _inline_root_ref(schema: Any) -> Any:
    """The schema with a root that is a $ref into itself replaced by what it names, beside the root's other keys (its
    $defs or definitions): zod-to-json-schema writes {"$ref": "#/definitions/Name", "definitions": {...}}, and
    llama-cpp-python's converter does not look past a node's $ref, so it never read the definitions and failed on a
    $ref inside them (KeyError)."""
    for _ in range(8):  # a chain of root refs; a loop is left to the converter
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        target = _pointer(schema, ref) if isinstance(ref, str) else None
        if not isinstance(target, dict) or target is schema:
            return schema
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    return schema


def _converter_error(e: Exception, schema: Any) -> str:
    """What llama-cpp-python's schema converter's exception says, in the schema's terms where it can be told."""
    from .json_schema import SchemaError

    text = str(e)
    if isinstance(e, SchemaError):
        return text
    m = _DANGLING_REF.match(text)
    ref = m.group(1) if m else e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) \
        and e.args[0].startswith("#") else None
    if ref is not None and _pointer(schema, ref) is None:
        return (f"the JSON schema's $ref {ref[:200]!r} points to nothing in the schema: define it (under $defs) or "
                "correct the reference")
    if ref is not None:
        return (f"the JSON schema's $ref {ref[:200]!r} names a definition the converter did not read (it does not "
                "look past a node's own $ref): write that node out instead of referring to it")
    if isinstance(e, ValueError) and text.startswith("Unsupported ref "):
        return (f"the JSON schema's $ref {text[len('Unsupported ref '):][:200]!r} is not supported: only references "
                "into the schema itself are ('#/$defs/name')")
    if text.startswith("Fetching remote schemas is not allowed"):
        return ("the JSON schema's $ref names another document, which is not supported: only references into the "
                "schema itself are ('#/$defs/name'); put what it names under $defs")
    if isinstance(e, AssertionError) and text.startswith("Pattern must start with"):
        return ("a pattern in the JSON schema must match whole strings: start it with ^ and end it with $ (the "
                "converter, as llama.cpp's, takes no other)")
    return f"the JSON schema cannot be turned into a grammar: {type(e).__name__}: {text[:500]}"


MAX_COUNT = 2000  # llama.cpp's own bound on a grammar's repetitions (MAX_REPETITION_THRESHOLD)
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_PATTERN_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _check_counts(node: Any, where: str, depth: int = 0) -> None:
    """InvalidOptionError for a length or count above MAX_COUNT anywhere in a schema: the converter writes such a
    count out as that many copies (minLength 10^9 took gigabytes) or nested groups (maxLength 20,000 overflowed
    llama.cpp's parser's stack)."""
    if depth > 200:
        raise InvalidOptionError(f"the JSON schema nests more than 200 levels deep (at {where}); flatten it")
    if isinstance(node, dict):
        if "$ref" in node and not isinstance(node["$ref"], str):
            raise InvalidOptionError(f"{where}.$ref must be a string (a reference such as '#/$defs/name'), got "
                                     f"{type(node['$ref']).__name__}")
        for key in ("enum", "anyOf", "oneOf", "type"):
            if node.get(key) == []:
                raise InvalidOptionError(f"{where}.{key} is an empty list: no JSON value could match; leave it out")
        for key, value in node.items():
            if key in _COUNTS and isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_COUNT:
                raise InvalidOptionError(f"{where}.{key} is {value}; specllm's grammars hold at most {MAX_COUNT} "
                                         f"(the converter writes each one out): leave it out or lower it")
            if key == "pattern" and isinstance(value, str):
                for m in _PATTERN_COUNT.finditer(value):
                    if any(n and int(n) > MAX_COUNT for n in m.groups()):
                        raise InvalidOptionError(f"{where}.pattern repeats {m.group(0)}; specllm's grammars hold at "
                                                 f"most {MAX_COUNT} repetitions: lower it")
            _check_counts(value, f"{where}.{key}", depth + 1)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_counts(value, f"{where}[{i}]", depth + 1)


def response_format(value: Any) -> Optional[str]:
    """The grammar for an OpenAI response_format: None for {"type": "text"}; JSON for {"type": "json_object"}
    (llama-server's optional "schema" beside it honoured); {"type": "json_schema", "json_schema": {"schema": ...}}
    for a schema. InvalidOptionError naming what is wrong otherwise."""
    if not isinstance(value, dict):
        raise InvalidOptionError("response_format must be an object such as {\"type\": \"json_object\"}")
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json(_object_if_anything(value.get("schema")))
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidOptionError("response_format json_schema needs {\"json_schema\": {\"name\": ..., "
                                     "\"schema\": {...}}}")
        return json(_object_if_anything(spec["schema"]))
    raise InvalidOptionError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _object_if_anything(schema: Any) -> Any:
    """A reply format's schema that allows anything ({}, true) means any JSON object, as llama-server reads it (its
    chat path: "an absent or empty schema means any object"); a JSON mode answers with an object."""
    from . import json_schema

    return None if json_schema.allows_anything(schema) else schema


def from_cli(any_json: bool, schema_file: Optional[str], gbnf_file: Optional[str]) -> Optional[str]:
    """The grammar `specllm-cli generate --json`, `--json-schema FILE` or `--grammar FILE` asks for (None: none).
    InvalidOptionError for more than one of them or a file that cannot be read."""
    given = [flag for flag, v in (("--json", any_json), ("--json-schema", schema_file), ("--grammar", gbnf_file)) if v]
    if len(given) > 1:
        raise InvalidOptionError(f"{' and '.join(given)} each constrain the reply: give one of them")
    if gbnf_file:
        rules = _read(gbnf_file, "--grammar")
        if not rules.strip():  # it was dropped: the reply ran unconstrained
            raise InvalidOptionError(f"--grammar: {gbnf_file} is empty; give GBNF rules with a root rule")
        from . import _core
        why = _core.gbnf_error(rules)  # before the model loads (a minute, the first time), not after
        if why:
            raise InvalidOptionError(f"--grammar: {gbnf_file}: {why}")
        return rules
    if schema_file:
        try:
            return json(_read(schema_file, "--json-schema"))
        except InvalidOptionError as e:
            if str(e).startswith("--json-schema: "):  # _read's, which names the file
                raise
            raise InvalidOptionError(f"--json-schema: {schema_file}: {e}") from None
    return json() if any_json else None


def _read(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidOptionError(f"{flag}: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
