"""JSON Schema -> GBNF where llama-cpp-python's converter parts from llama.cpp's: an integer's minimum and maximum
(it ignored them: {"type": "integer", "minimum": 5} wrote 3), and ranges nothing fits (refused, not written as their
minimum)."""

import json
import re

import pytest

from specllm import InvalidOptionError, _core, grammar
from specllm.json_schema import int_range


def as_regex(gbnf: str) -> re.Pattern:
    """int_range's GBNF (literals, [a-b] classes, {m,n} counts, groups, |) as a Python regular expression."""
    return re.compile(re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), gbnf).replace(" ", ""))


RANGES = [(0, 0), (5, 20), (-20, -5), (-7, 13), (0, 9), (1, 10), (10, 99), (7, 1234), (-1234, -7), (99, 101),
          (100, 199), (123, 456), (5, None), (0, None), (-5, None), (37, None), (None, 5), (None, 0), (None, -37),
          (None, 250), (-999, 999), (100, None), (105, None), (2000, None), (None, -902), (None, -100),
          (-1001, None)]  # llama.cpp's own one-ended ranges were wrong here (minimum 100 took 10-19)


@pytest.mark.parametrize("lo, hi", RANGES)
def test_an_integer_range_is_exactly_its_integers(lo, hi):
    g = int_range(lo, hi)
    assert _core.gbnf_error(f"root ::= {g}") == "", g
    pattern = as_regex(g)
    for n in range(-1500, 1501):
        assert bool(pattern.fullmatch(str(n))) == ((lo is None or n >= lo) and (hi is None or n <= hi)), (n, g)
    assert not pattern.fullmatch("007") and not pattern.fullmatch("--5")  # no leading zeros (-0, as llama.cpp's,
    # where 0 is in range: valid JSON, and 0)


@pytest.mark.parametrize("schema, lo, hi", [
    ({"minimum": 5, "maximum": 20}, 5, 20),
    ({"minimum": 2.5, "maximum": 7.9}, 3, 7),
    ({"exclusiveMinimum": 5, "exclusiveMaximum": 9}, 6, 8),
    ({"minimum": 5, "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": True}, 6, 8),  # draft 4
    ({"minimum": -3}, -3, None),
    ({"maximum": 40}, None, 40),
])
def test_a_bounded_integer_schema_gives_the_grammar_of_its_range(schema, lo, hi):
    rules = grammar.json({"type": "integer", **schema})
    assert int_range(lo, hi) in rules


@pytest.mark.parametrize("lo, hi", [(10 ** 17, None), (None, -10 ** 17), (2 ** 63 - 1, None), (-2 ** 63, None)])
def test_a_bound_of_many_digits_gives_a_grammar_llama_cpp_reads(lo, hi):
    """minimum 10**17 wrote a count of {17,15}: llama.cpp's parser met it with bad_alloc, or the process was killed."""
    g = int_range(lo, hi)
    assert _core.gbnf_error(f"root ::= {g}") == "", g
    bound = lo if lo is not None else hi
    assert as_regex(g).fullmatch(str(bound)) and not as_regex(g).fullmatch(str(bound - 1 if lo is not None else
                                                                                    bound + 1))


def test_an_enum_or_const_beside_bounds_still_decides(tiny):
    """The range was written in place of the rest: {"type": "integer", "minimum": 0, "enum": [7, 8]} took any natural
    number."""
    assert '"7"' in grammar.json({"type": "integer", "minimum": 0, "enum": [7, 8]})
    assert '"3"' in grammar.json({"type": "integer", "maximum": 5, "const": 3})


def test_generated_integers_stay_in_their_range(tiny, make_llm):
    llm = make_llm(tiny["target"], "ngram")
    rules = grammar.json({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 20}},
                          "required": ["n"]})
    seen = set()
    for seed in range(12):
        out = llm.generate("a number:", grammar=rules, max_tokens=40, temperature=1.0, seed=seed)
        assert out.finish_reason == "stop", out.text
        n = json.loads(out.text)["n"]
        assert 5 <= n <= 20, out.text
        seen.add(n)
    assert len(seen) > 1  # sampled, not one forced value


@pytest.mark.parametrize("schema, words", [
    ({"type": "integer", "minimum": 5, "maximum": 2}, "allows no integer (at least 5, at most 2)"),
    ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "allows no integer"),
    ({"type": "integer", "minimum": "five"}, "minimum must be a finite number"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "allows nothing: minLength 5 is more than maxLength 2"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 is more than maxItems 1"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 0}}},
     "the schema at a allows no integer"),
])
def test_a_range_nothing_fits_is_refused(schema, words):
    with pytest.raises(InvalidOptionError, match=re.escape(words)):
        grammar.json(schema)


def test_an_unanchored_pattern_says_what_to_do():
    with pytest.raises(InvalidOptionError, match=r"must match whole strings: start it with \^ and end it with \$"):
        grammar.json({"type": "string", "pattern": "[a-z]+"})
    assert grammar.json({"type": "string", "pattern": "^[a-z]+$"})


def test_the_cli_names_the_schema_file_in_its_error(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"type": "integer", "minimum": 5, "maximum": 2}')
    with pytest.raises(InvalidOptionError, match=rf"^--json-schema: {re.escape(str(path))}: the schema at the root "
                                                 r"allows no integer"):
        grammar.from_cli(False, str(path), None)


def sampled(llm, schema, seeds=range(8), max_tokens=120) -> list:
    """The JSON values generated under the schema's grammar at temperature 1 (the tiny random model writes random
    valid strings of a grammar), each whole (the grammar ended it) and parsed."""
    rules, out = grammar.json(schema), []
    for seed in seeds:
        got = llm.generate("json:", grammar=rules, max_tokens=max_tokens, temperature=1.0, seed=seed)
        if got.finish_reason == "stop":
            out.append(json.loads(got.text))  # a raw control character in a string was not JSON
    assert out, "no generation ended within max_tokens"
    return out


def test_what_a_schema_generates_is_json_that_follows_it(tiny, make_llm):
    """Review finds (llama-cpp-python's converter where llama.cpp's differs, or where both fail): raw control
    characters in strings, $ref rules named after their last segment and shared (two #/$defs/Item, a property named
    Item beside one), a property named "" taken for the root, allOf around one $ref written as {}, prefixItems beside
    items dropped, and patterns: "." and [^...] taking quotes and backslashes unescaped, a top-level | outside the
    quotes, lazy quantifiers misread, \\d and \\. written as GBNF escapes that do not parse."""
    llm = make_llm(tiny["target"])
    assert all(isinstance(v, str) for v in sampled(llm, {"type": "string"}, max_tokens=60))
    defs = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Item"}, "b": {"$ref": "#/definitions/Item"},
                                             "Item": {"const": "x"}, "": {"type": "integer"}},
            "required": ["a", "b", "Item", ""], "$defs": {"Item": {"enum": [1, 2]}},
            "definitions": {"Item": {"enum": ["p", "q"]}}}
    for v in sampled(llm, defs):
        assert v["a"] in (1, 2) and v["b"] in ("p", "q") and v["Item"] == "x" and isinstance(v[""], int), v
    root_all_of = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}]}
    assert all(isinstance(v["a"], int) for v in sampled(llm, root_all_of))  # the root's own: was no root rule
    wrapped = {"type": "object", "properties": {"s": {"allOf": [{"$ref": "#/$defs/S"}], "description": "a state"}},
               "required": ["s"], "$defs": {"S": {"enum": ["open", "closed"]}}}
    assert all(v["s"] in ("open", "closed") for v in sampled(llm, wrapped))
    optional = {"type": "object", "properties": {"n": {"type": ["integer", "null"], "minimum": 5, "maximum": 7}},
                "required": ["n"]}
    assert all(v["n"] is None or 5 <= v["n"] <= 7 for v in sampled(llm, optional))
    pair = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": {"type": "boolean"}}
    assert all(len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str) for v in sampled(llm, pair))
    for pattern in ["^.{3,12}$", "^[^a-z ]{3,12}$", "^ab|cd$", "^a+?b$", "^\\d+\\.\\d+$", "^(?:x|y)[\\d.]{1,3}$",
                    "^v\\$[\\^_]$", '^say "hi"$', "^a\\\\b\"?$",  # a quote, a backslash: as JSON writes them
                    "^[ -~]{6}$", "^\\x41\\x22?\\x01?$", "^[\\x00-\\x7f]{2}$"]:  # classes cut around them
        for v in sampled(llm, {"type": "string", "pattern": pattern}, seeds=range(4), max_tokens=40):
            assert re.fullmatch(pattern, v), (pattern, v)


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": '^[a"]$'}, "a quote or a backslash in a pattern's [class] is not supported"),
    ({"type": "string", "pattern": "^[\\x00-\\x1f]$"}, "holds only characters a JSON string must escape"),
    ({"type": "string", "pattern": "^(a$"}, "is not a valid regular expression"),
    ({"type": "string", "pattern": "^[z-a]$"}, "is not a valid regular expression"),
    ({"type": "string", "pattern": "^\\D$"}, "pattern escape \\D is not supported"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf is supported for objects"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 2}, "minItems 2 wants more"),
])
def test_what_the_converter_would_write_wrong_is_refused(schema, words):
    with pytest.raises(InvalidOptionError, match=re.escape(words)):
        grammar.json(schema)
