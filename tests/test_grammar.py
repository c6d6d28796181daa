"""Grammars (GBNF): the output follows the grammar, and speculative decoding under a grammar gives plain decoding's
constrained output. The reference is llama-cpp-python evaluating one token at a time with a mask computed here in
Python (the tokens whose text keeps the output a prefix of a word of the grammar's finite language)."""

import itertools
import json
import re

import numpy as np
import pytest

import specllm
from specllm import InvalidOptionError

WORDS = ["the", "in", "an"]
GRAMMAR = 'root ::= word (" " word){5}\nword ::= "the" | "in" | "an"'
LANGUAGE = {" ".join(ws) for ws in itertools.product(WORDS, repeat=6)}
PROMPTS = ["the the in the an", "Hello world", "in in in in in in in in"]


def allowed(text: str, piece: bytes) -> bool:
    if not piece:
        return False
    try:
        s = text + piece.decode("ascii")
    except UnicodeDecodeError:
        return False
    return any(w.startswith(s) for w in LANGUAGE)


def reference_greedy(tiny, llm, prompt: str, max_tokens: int = 40):
    """The constrained greedy output, token by token: argmax of the target's logits over the allowed tokens (an
    end-of-generation token only once the text is a whole word of the language)."""
    import llama_cpp

    tokens = llm.prompt_tokens(prompt)
    # flash attention and an F32 cache: its logits equal specllm's for the tiny F32 model (test_logprobs.py)
    model = llama_cpp.Llama(model_path=tiny["target"], n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True,
                            flash_attn=True, type_k=0, type_v=0, verbose=False)
    pieces = [llm.token_bytes(t) for t in range(llm._engine.target.n_vocab)]
    eos = model.token_eos()
    try:
        model.eval(tokens[:-1])
        out, text, last = [], "", tokens[-1]
        for _ in range(max_tokens):
            model.eval([last])
            row = np.array(model.scores[model.n_tokens - 1], dtype=np.float64)
            mask = np.array([allowed(text, p) for p in pieces])
            mask[eos] = text in LANGUAGE
            row[~mask] = -np.inf
            last = int(np.argmax(row))
            if last == eos:
                break
            out.append(last)
            text += pieces[last].decode("ascii")
    finally:
        model.close()
    return out, text


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    llm = make_llm(tiny["target"])
    return {p: llm.generate(p, max_tokens=40, grammar=GRAMMAR) for p in PROMPTS}


def test_plain_decoding_follows_the_grammar_as_the_reference_does(tiny, make_llm, plain):
    llm = make_llm(tiny["target"])
    for p in PROMPTS:
        tokens, text = reference_greedy(tiny, llm, p)
        out = plain[p]
        assert out.text in LANGUAGE and out.finish_reason == "stop", out.text
        assert (out.tokens, out.text) == (tokens, text)


def test_unconstrained_output_is_not_in_the_language(tiny, make_llm):
    """The grammar is what makes the text above: without it the tiny model writes something else."""
    llm = make_llm(tiny["target"])
    assert all(llm.generate(p, max_tokens=40).text not in LANGUAGE for p in PROMPTS)


@pytest.mark.parametrize("draft, kw", [
    ("draft", {"draft_length": 4}), ("draft", {"draft_length": 16}), ("far_draft", {"draft_length": 4}),
    ("near_draft", {"draft_length": 6, "exact": True}), ("ngram", {"draft_length": 8}),
    ("draft", {"ngram": True, "draft_length": "auto"})])
def test_speculative_greedy_output_is_plain_decodings(tiny, make_llm, plain, draft, kw):
    gen = {k: v for k, v in kw.items() if k == "draft_length"}
    llm_kw = {k: v for k, v in kw.items() if k != "draft_length"}
    llm = make_llm(tiny["target"], "ngram" if draft == "ngram" else tiny[draft], **llm_kw)
    drafted = 0
    for p in PROMPTS:
        out = llm.generate(p, max_tokens=40, grammar=GRAMMAR, **gen)
        assert (out.tokens, out.text, out.finish_reason) == (plain[p].tokens, plain[p].text, "stop")
        drafted += out.stats.n_drafted
    if gen.get("draft_length") != "auto":
        assert drafted > 0  # drafts were verified under the grammar, not skipped


@pytest.mark.parametrize("options", [{}, {"top_k": 5}, {"top_p": 0.8, "min_p": 0.05}])
def test_sampling_under_a_grammar_gives_plain_samplings_text(tiny, make_llm, options):
    """Coupled acceptance: a seed names one text, whatever drafts; the grammar masks before warping."""
    plain = make_llm(tiny["target"])
    spec = make_llm(tiny["target"], tiny["near_draft"])
    texts = set()
    for seed in range(6):
        want = plain.generate(PROMPTS[1], max_tokens=40, temperature=1.2, seed=seed, grammar=GRAMMAR, **options)
        got = spec.generate(PROMPTS[1], max_tokens=40, temperature=1.2, seed=seed, grammar=GRAMMAR, draft_length=4,
                            **options)
        assert got.text == want.text and want.text in LANGUAGE
        texts.add(want.text)
    assert len(texts) > 1  # sampled, not greedy


@pytest.mark.parametrize("options", [
    {"temperature": 0.0}, {"temperature": 1.2}, {"temperature": 0.7, "top_k": 2}, {"temperature": 1.5, "min_p": 0.2},
    {"temperature": 1.0, "top_k": 3, "min_p": 0.1}, {"temperature": 1.0, "top_p": 0.8}])
def test_the_shortcuts_give_what_masking_every_row_gives(tiny, make_llm, options):
    """A greedy row's allowed argmax, and coupled sampling's draw found in race order (grammar.h), are what
    masking the whole row and warping it gives: the same text for every seed, plain and speculative."""
    for draft in (None, tiny["near_draft"]):
        fast, full = make_llm(tiny["target"], draft), make_llm(tiny["target"], draft)
        full._engine.set_grammar_full_mask_for_tests(True)
        for seed in range(8):
            for p in PROMPTS[:2]:
                kw = dict(options, max_tokens=40, seed=seed, grammar=GRAMMAR, draft_length=4)
                assert fast.generate(p, **kw).text == full.generate(p, **kw).text, (draft, seed, p)


def test_rejection_sampling_stays_in_the_language(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["near_draft"])
    for seed in range(6):
        out = llm.generate(PROMPTS[0], max_tokens=40, temperature=1.0, seed=seed, grammar=GRAMMAR,
                           acceptance="rejection", draft_length=4)
        assert out.text in LANGUAGE and out.finish_reason == "stop"


def test_a_json_schema_gives_json_that_follows_it(tiny, make_llm):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    rules = specllm.grammar.json(schema)
    for llm in (make_llm(tiny["target"]), make_llm(tiny["target"], tiny["draft"], ngram=True)):
        for p in PROMPTS:
            out = llm.generate(p, max_tokens=120, grammar=rules)
            value = json.loads(out.text)
            assert out.finish_reason == "stop" and set(value) == {"n", "ok"}
            assert isinstance(value["n"], int) and isinstance(value["ok"], bool)


def test_streams_and_stop_strings_under_a_grammar(tiny, make_llm, plain):
    llm = make_llm(tiny["target"], tiny["draft"])
    with llm.stream(PROMPTS[0], max_tokens=40, grammar=GRAMMAR, draft_length=4) as s:
        assert "".join(c.text for c in s) == plain[PROMPTS[0]].text
    text = plain[PROMPTS[0]].text
    cut = llm.generate(PROMPTS[0], max_tokens=40, grammar=GRAMMAR, stop=text[7:10])
    assert cut.text == text[:7] and cut.finish_reason == "stop"
    short = llm.generate(PROMPTS[0], max_tokens=3, grammar=GRAMMAR)
    assert short.finish_reason == "length" and text.startswith(short.text)
    # the next generation is unconstrained again
    assert llm.generate(PROMPTS[0], max_tokens=40).text == make_llm(tiny["target"]).generate(PROMPTS[0],
                                                                                                max_tokens=40).text


@pytest.mark.parametrize("bad, error, words", [
    ("", InvalidOptionError, "empty"), ("  \n", InvalidOptionError, "empty"),
    ("root ::= (", InvalidOptionError, "could not be parsed"),
    ('word ::= "x"', InvalidOptionError, "root"),
    ("root ::= undefined-rule", InvalidOptionError, "undefined-rule"),
    ('root ::= root "x"', InvalidOptionError, "could not be parsed"),  # left recursion
    (b"root ::= \"x\"", TypeError, "str"), (5, TypeError, "str")])
def test_bad_grammars_are_typed_errors_that_say_why(tiny, make_llm, capfd, bad, error, words):
    llm = make_llm(tiny["target"], tiny["draft"])
    capfd.readouterr()
    with pytest.raises(error, match=words):
        llm.generate("Hello", max_tokens=4, grammar=bad)
    with pytest.raises(error):
        llm.check_options(grammar=bad)
    assert "error parsing grammar" not in capfd.readouterr().err  # the parser's stderr is in the message instead
    assert llm.generate("Hello", max_tokens=4).tokens  # the LLM goes on


def test_a_grammar_nested_deeper_than_llama_cpps_parser_can_recurse_is_refused(tiny, make_llm):
    llm = make_llm(tiny["target"])
    deep = "root ::= " + "(" * 20000 + '"a"' + ")" * 20000  # overflowed the parser's stack: the process died
    with pytest.raises(InvalidOptionError, match="nests groups 20000 deep"):
        llm.check_options(grammar=deep)
    fine = "root ::= " + "(" * 2400 + '"a"' + ")" * 2400 + ' # ((((((\nx ::= "(((" [(((]'  # comments, strings
    assert llm.generate("Hello", max_tokens=2, grammar=fine).text == "a"


def test_a_grammar_with_ignore_eos_is_refused(tiny, make_llm):
    llm = make_llm(tiny["target"])
    with pytest.raises(InvalidOptionError, match="ignore_eos"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, ignore_eos=True)


ODD = ["C:\\dir", 'say "hi"', "\u0000nul", "\\u0041", "tab\there", "\u0001"]


def test_literals_with_backslashes_quotes_and_control_characters_give_the_json_they_name(tiny, make_llm):
    r"""llama-cpp-python's converter did not escape a backslash in a literal: enum "C:\\dir" came out as "C:\dir"
    (invalid JSON), "\\u0000" as a raw NUL that cut the output, and a '"' in a property's name made GBNF that did not
    parse (json_schema.py, as llama.cpp's C++ converter)."""
    llm = make_llm(tiny["target"])
    enum = specllm.grammar.json({"enum": ODD})
    names = {"type": "object", "properties": {"a\\b": {"type": "integer"}, 'q"x': {"const": "C:\\"}},
             "required": ["a\\b", 'q"x'], "additionalProperties": False}
    seen = set()
    for seed in range(8):
        out = llm.generate(PROMPTS[seed % 3], max_tokens=40, grammar=enum, temperature=1.0, seed=seed)
        assert out.finish_reason == "stop" and json.loads(out.text) in ODD, out.text
        seen.add(json.loads(out.text))
        obj = json.loads(llm.generate(PROMPTS[0], max_tokens=60, grammar=specllm.grammar.json(names),
                                      temperature=1.0, seed=seed).text)
        assert set(obj) == {"a\\b", 'q"x'} and type(obj["a\\b"]) is int and obj['q"x'] == "C:\\", obj
    assert len(seen) > 1


def test_a_schema_that_allows_anything_allows_any_json_value(tiny, make_llm):
    """{} (pydantic's Any), true, or a schema of annotations only: any JSON value, as llama.cpp's C++ converter has
    it. The Python port made it an object, and refused list[Any] ({"type": "array", "items": {}}: KeyError
    'prefixItems'); false allows nothing and says so."""
    llm = make_llm(tiny["target"])
    lists = specllm.grammar.json({"type": "array", "items": {}, "minItems": 1})
    anything = specllm.grammar.json({"type": "object", "properties": {"x": {"description": "anything"}, "y": True},
                                     "required": ["x", "y"], "additionalProperties": False})
    kinds, ended = set(), 0
    for seed in range(8):
        value = json.loads(llm.generate(PROMPTS[1], max_tokens=200, grammar=lists, temperature=1.0, seed=seed).text)
        assert isinstance(value, list) and len(value) >= 1, value
        out = llm.generate(PROMPTS[2], max_tokens=200, grammar=anything, temperature=1.0, seed=seed)
        if out.finish_reason == "length":  # a random model's long string
            continue
        obj, ended = json.loads(out.text), ended + 1
        assert set(obj) == {"x", "y"}, obj
        kinds |= {type(v).__name__ for v in value + [obj["x"], obj["y"]]}
    assert ended >= 4 and len(kinds - {"dict"}) >= 2, (ended, kinds)  # not only objects
    assert "root ::= value" in specllm.grammar.json(True).splitlines()
    with pytest.raises(InvalidOptionError, match="false: no JSON value matches it"):
        specllm.grammar.json({"type": "object", "properties": {"x": {"anyOf": [False]}}})


def test_false_forbids_where_json_schema_uses_it_to(tiny, make_llm):
    """A property of false must not appear and items of false allows no items beyond prefixItems; the converter
    refused both ('the schema at b is false', KeyError 'prefixItems')."""
    llm = make_llm(tiny["target"])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": False, "c": {"type": "array", "items":
              False}, "d": {"type": "array", "prefixItems": [{"type": "boolean"}], "items": False}},
              "required": ["a", "c", "d"]}
    for seed in range(3):
        out = llm.generate(PROMPTS[2], max_tokens=200, grammar=specllm.grammar.json(schema), temperature=1.0,
                           seed=seed)
        value = json.loads(out.text)
        assert set(value) == {"a", "c", "d"} and value["c"] == [] and len(value["d"]) == 1, value
    with pytest.raises(InvalidOptionError, match="requires property 'b', whose schema is false"):
        specllm.grammar.json(dict(schema, required=["a", "b"]))
    with pytest.raises(InvalidOptionError, match="a property of false .* beside additionalProperties"):
        specllm.grammar.json(dict(schema, additionalProperties=True))  # the key could come back as an extra one
    with pytest.raises(InvalidOptionError, match="at least 2 items but allows 1"):
        specllm.grammar.json({"type": "array", "prefixItems": [{"type": "integer"}], "items": False, "minItems": 2})


@pytest.mark.parametrize("schema, words", [
    ("{not json", "not JSON"), ([1, 2], "object"), ({"type": "object", "properties": 5}, "cannot be turned"),
    ({"$ref": "#/definitions/missing"}, r"\$ref '#/definitions/missing' points to nothing"),
    ({"$defs": {"b": {}}, "properties": {"x": {"$ref": "#/$defs/a"}}}, r"\$ref '#/\$defs/a' points to nothing"),
    ({"$ref": "https://example.com/s.json"}, "another document, which is not supported"),
    ({"$ref": "s.json"}, "is not supported: only references into the schema itself"),
    ({"properties": {"x": {"$ref": 5}}}, r"schema\.properties\.x\.\$ref must be a string"),
    ({"enum": []}, "schema.enum is an empty list"), ({"anyOf": []}, "schema.anyOf is an empty list"),
    ({"type": "string", "minLength": 10 ** 9}, "schema.minLength is 1000000000"),  # once grew a server to 20 GB
    ({"type": "object", "properties": {"a": {"type": "array", "maxItems": 2001}}}, r"properties\.a\.maxItems"),
    ({"type": "string", "pattern": "^x{1,5000}$"}, "repeats"),
    (json.loads('{"not": ' * 300 + "{}" + "}" * 300), "more than 200 levels"),
    ("[" * 100000 + "]" * 100000, "not JSON"),  # RecursionError escaped
])
def test_bad_json_schemas_are_typed_errors(schema, words):
    with pytest.raises(InvalidOptionError, match=words):
        specllm.grammar.json(schema)


def test_a_schema_whose_root_refers_to_its_definitions_is_read_whole():
    """zod-to-json-schema's output with a name: the root is a $ref to a definition that refers to others. The
    converter does not look past the root's $ref, so it never read the definitions (KeyError '#/definitions/M')."""
    zod = {"$ref": "#/definitions/N", "definitions": {
        "N": {"type": "object", "properties": {"x": {"$ref": "#/definitions/M"}}, "required": ["x"]},
        "M": {"type": "integer"}}}
    gbnf = specllm.grammar.json(zod)
    assert "root ::=" in gbnf and '"\\"x\\""' in gbnf, gbnf
    # a chain of root refs too; the schema the caller gave is left as it was
    chain = {"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"type": "integer"}}}
    assert "integral-part" in specllm.grammar.json(chain) and chain["$ref"] == "#/$defs/A"


@pytest.mark.parametrize("fmt, words", [
    ("json", "object"), ({"type": "xml"}, "type must be"), ({"type": "json_schema"}, "json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema")])
def test_bad_response_formats_are_typed_errors(fmt, words):
    with pytest.raises(InvalidOptionError, match=words):
        specllm.grammar.response_format(fmt)


def test_response_formats():
    assert specllm.grammar.response_format({"type": "text"}) is None
    assert "root" in specllm.grammar.response_format({"type": "json_object"})
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert specllm.grammar.response_format({"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}) \
        == specllm.grammar.json(schema)
    # a reply format's schema that allows anything is any object, as llama-server reads it (grammar.json({}) is any
    # JSON value, as llama.cpp's converter makes it)
    for anything in ({}, True, {"description": "whatever"}):
        assert specllm.grammar.response_format({"type": "json_object", "schema": anything}) == specllm.grammar.json()
        assert specllm.grammar.response_format({"type": "json_schema", "json_schema": {"name": "a", "schema":
                                                anything}}) == specllm.grammar.json()
    tuple_then_any = specllm.grammar.json({"prefixItems": [{"type": "integer"}], "items": {}})
    assert "integer" in tuple_then_any.split("root ::=")[1].splitlines()[0], tuple_then_any  # the tuple is kept


def test_specllm_generate_takes_a_grammar(tiny, plain):
    out = specllm.generate(PROMPTS[0], tiny["target"], None, grammar=GRAMMAR, max_tokens=40, n_threads=1, n_ctx=512,
                           profile_costs=False)
    assert out.text == plain[PROMPTS[0]].text


KEYS = {"type": "object", "properties": {
    "temperature_in_celsius": {"type": "integer"}, "is_raining_right_now": {"type": "boolean"},
    "wind_direction": {"enum": ["north", "south"]}},
    "required": ["temperature_in_celsius", "is_raining_right_now", "wind_direction"], "additionalProperties": False}
FLAT = [10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2]  # verify costs where a batch costs about one step: drafts pay


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_the_text_a_grammar_forces_is_drafted_and_the_output_stays_plain_decodings(tiny, make_llm, draft):
    """A JSON schema's keys and punctuation are forced by the grammar: "auto" drafts them (free, the target
    verifies), and the text is plain decoding's under the same grammar, greedy and sampled."""
    rules = specllm.grammar.json(KEYS)
    plain = make_llm(tiny["target"])
    llm = make_llm(tiny["target"], "ngram") if draft == "ngram" else make_llm(tiny["target"], tiny["draft"], ngram=True)
    llm._engine.set_verify_costs(FLAT)
    for p in PROMPTS:
        for opts in ({}, {"temperature": 1.0, "seed": 3}):
            want = plain.generate(p, max_tokens=160, grammar=rules, **opts)
            got = llm.generate(p, max_tokens=160, grammar=rules, **opts)
            assert (got.text, got.finish_reason) == (want.text, want.finish_reason == "stop" and "stop"), opts
            assert set(json.loads(got.text)) == set(KEYS["properties"])
            assert want.stats.n_grammar_steps == 0  # plain decoding stays plain
            # the three keys are drafted in few steps: most of their tokens accepted
            assert got.stats.n_grammar_steps >= 2 and got.stats.n_accepted >= 12, got.stats
            assert got.stats.n_steps < want.stats.n_steps * 0.8, (got.stats.n_steps, want.stats.n_steps)
    llm._engine.set_grammar_drafts(False)  # the switch bench.grammar compares with: none drafted, the same text
    off = llm.generate(PROMPTS[0], max_tokens=160, grammar=rules)
    assert off.stats.n_grammar_steps == 0 and off.text == plain.generate(PROMPTS[0], max_tokens=160, grammar=rules).text


@pytest.mark.parametrize("gbnf, words", [('root ::= "a', "unexpected end of input"),
                                         ('start ::= "a"', "does not contain a 'root' symbol"),
                                         ('root ::= root "a"', "left recursion"),
                                         ('root ::= "a" b', "Undefined rule identifier 'b'"),
                                         ('root ::= "<a>" [<] b', "Undefined rule identifier 'b'"),
                                         ("root ::= " + "(" * 3000 + '"a"' + ")" * 3000, "nests groups 3000 deep"),
                                         ('root ::= "a"{5,2}', "repeats something {5,2} times"),
                                         ('root ::= ("a" | [b]){ 10 , 009 } "{1,2}"', "{ 10 , 009 }"),
                                         ("root ::= [a]{" + "9" * 30 + ",3}", "maximum is below its minimum")],
                         ids=["unclosed", "no-root", "left-recursion", "undefined-rule", "angle-brackets-in-literals",
                              "deep", "backward-repeat", "backward-repeat-spaced", "backward-repeat-huge"])
def test_a_grammar_is_checked_without_a_model_as_with_one(tiny, make_llm, gbnf, words):
    """_core.gbnf_error reads a grammar before any model is loaded (the CLI's --grammar file) and says what the
    loaded model's check says."""
    from specllm import _core
    assert words in _core.gbnf_error(gbnf)
    with pytest.raises(ValueError, match=re.escape(_core.gbnf_error(gbnf))):
        make_llm(tiny["target"]).generate("x", max_tokens=1, grammar=gbnf)


@pytest.mark.parametrize("gbnf", ['root ::= "yes" | "no"  # <no token in a comment>', 'root ::= "<" [<>]',
                                  'root ::= "a" <[0]>', "root ::= <|endoftext|>", 'root ::= <|x|> "a'])
def test_a_grammar_naming_tokens_is_left_to_the_model(gbnf):
    from specllm import _core
    assert _core.gbnf_error(gbnf) == ""  # tokens need a vocabulary: read once the model is loaded


@pytest.mark.parametrize("gbnf", ['root ::= "a"{2,5}', 'root ::= "a"{3,3} [b]{0,} "c"{4}', 'root ::= "{5,2}"',
                                  'root ::= [{5,2}] "x"', 'root ::= "a"  # not a repeat: {5,2}'])
def test_counts_that_are_not_backward_are_left_to_llama_cpp(gbnf):
    """The check for a repeat {m,n} with n < m reads rules only, not strings, classes or comments."""
    from specllm import _core
    assert _core.gbnf_error(gbnf) == ""
