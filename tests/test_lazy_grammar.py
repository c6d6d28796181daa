"""Lazy grammars (grammar_triggers, as llama-server constrains tool calls): the output is free until it holds a
trigger word, and from the word on it follows the grammar. The reference is llama-cpp-python evaluating one token at
a time: unmasked argmax until the text holds the word, then the argmax over the tokens whose text keeps the output
from the word on a prefix of a word of the grammar's finite language (test_grammar.py's reference, started late)."""

import itertools
import re

import numpy as np
import pytest

from specllm import InvalidOptionError

PROMPTS = ["Hello world", "the the in the an"]
# the tiny target's free greedy output for PROMPTS[0] begins 'aron:T cqen...' (tokens 'ar' 'on' ':' 'T' ...): the
# trigger ":T" ends at a token's end, early in the reply
TRIGGER = ":T"
GRAMMAR = 'root ::= ":T" (" " word){3}\nword ::= "the" | "in" | "an"'
LANGUAGE = {":T " + " ".join(ws) for ws in itertools.product(["the", "in", "an"], repeat=3)}


def reference_greedy(tiny, llm, prompt, trigger, language, max_tokens=40):
    import llama_cpp

    tokens = llm.prompt_tokens(prompt)
    model = llama_cpp.Llama(model_path=tiny["target"], n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True,
                            flash_attn=True, type_k=0, type_v=0, verbose=False)
    pieces = [llm.token_bytes(t) for t in range(llm._engine.target.n_vocab)]
    eos = model.token_eos()

    def allowed(text, piece):
        try:
            s = text + piece.decode("ascii")
        except UnicodeDecodeError:
            return False
        return bool(piece) and any(w.startswith(s) for w in language)

    try:
        model.eval(tokens[:-1])
        out, text, last, start = [], "", tokens[-1], None  # start: where the trigger began, once it fired
        for _ in range(max_tokens):
            model.eval([last])
            row = np.array(model.scores[model.n_tokens - 1], dtype=np.float64)
            if start is not None:
                mask = np.array([allowed(text[start:], p) for p in pieces])
                mask[eos] = text[start:] in language
                row[~mask] = -np.inf
            last = int(np.argmax(row))
            if last == eos:
                break
            out.append(last)
            text += pieces[last].decode("utf-8", "replace")
            if start is None and trigger in text:
                start = text.index(trigger)
    finally:
        model.close()
    return out, text


@pytest.fixture(scope="module")
def free(tiny, make_llm):
    llm = make_llm(tiny["target"])
    return {p: llm.generate(p, max_tokens=40) for p in PROMPTS}


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    llm = make_llm(tiny["target"])
    return {p: llm.generate(p, max_tokens=40, grammar=GRAMMAR, grammar_triggers=[TRIGGER]) for p in PROMPTS}


def test_free_until_the_trigger_then_the_grammar_as_the_reference(tiny, make_llm, free, plain):
    llm = make_llm(tiny["target"])
    out = plain[PROMPTS[0]]
    assert (out.tokens, out.text) == reference_greedy(tiny, llm, PROMPTS[0], TRIGGER, LANGUAGE)
    at = free[PROMPTS[0]].text.index(TRIGGER)
    assert 0 < at < 10  # the free text before the trigger is kept, and the grammar ended the reply
    assert out.text[:at] == free[PROMPTS[0]].text[:at]
    assert out.text[at:] in LANGUAGE and out.finish_reason == "stop" and out.text != free[PROMPTS[0]].text


def test_a_trigger_the_output_never_holds_changes_nothing(tiny, make_llm, free, plain):
    assert TRIGGER not in free[PROMPTS[1]].text
    out = plain[PROMPTS[1]]
    assert (out.tokens, out.text, out.finish_reason) == (free[PROMPTS[1]].tokens, free[PROMPTS[1]].text, "length")
    assert out.stats.n_grammar_steps == 0


def test_a_word_whose_token_goes_on_where_the_grammar_cannot_does_not_trigger(tiny, make_llm, free):
    """'on' is written as the token 'on' (after 'ar'); a grammar for "o" then "X" cannot read "on", so that "o"
    starts nothing and the output stays free (the reference: no token ending in "o" or holding "oX" follows)."""
    llm = make_llm(tiny["target"])
    text = free[PROMPTS[0]].text
    assert "on" in text and not any(text[i] == "o" and text[i + 1:i + 2] in ("", "X") for i in range(len(text)))
    out = llm.generate(PROMPTS[0], max_tokens=40, grammar='root ::= "oX"', grammar_triggers=["o"])
    assert (out.tokens, out.text) == (free[PROMPTS[0]].tokens, text)


@pytest.mark.parametrize("draft, kw", [
    ("draft", {"draft_length": 4}), ("near_draft", {"draft_length": 6, "exact": True}),
    ("ngram", {"draft_length": 8}), ("draft", {"ngram": True, "draft_length": "auto"})])
def test_speculative_greedy_output_is_plain_decodings(tiny, make_llm, plain, draft, kw):
    gen = {k: v for k, v in kw.items() if k == "draft_length"}
    llm = make_llm(tiny["target"], "ngram" if draft == "ngram" else tiny[draft],
                   **{k: v for k, v in kw.items() if k != "draft_length"})
    drafted = 0
    for p in PROMPTS:
        out = llm.generate(p, max_tokens=40, grammar=GRAMMAR, grammar_triggers=[TRIGGER], **gen)
        assert (out.tokens, out.text, out.finish_reason) == (plain[p].tokens, plain[p].text, plain[p].finish_reason)
        drafted += out.stats.n_drafted
    if gen.get("draft_length") != "auto":
        assert drafted > 0


@pytest.mark.parametrize("options", [{}, {"top_k": 5}, {"top_p": 0.8, "min_p": 0.05}])
def test_sampling_gives_plain_samplings_text(tiny, make_llm, options):
    """Coupled acceptance under a lazy grammar: a seed names one text, whatever is drafted; where the trigger fired
    the rest follows the grammar."""
    plain = make_llm(tiny["target"])
    spec = make_llm(tiny["target"], tiny["near_draft"])
    grammar = 'root ::= "e" (" " word){2}\nword ::= "the" | "in" | "an"'
    fired = 0
    for seed in range(8):
        kw = dict(max_tokens=40, temperature=0.8, seed=seed, grammar=grammar, grammar_triggers=["e"], **options)
        want = plain.generate(PROMPTS[0], **kw)
        got = spec.generate(PROMPTS[0], draft_length=4, **kw)
        assert got.text == want.text
        fired += bool(re.search(r"e( (the|in|an)){2}$", want.text)) and want.finish_reason == "stop"
    assert fired >= 4  # "e" is common in the tiny model's text: most samples were constrained after it


def test_bad_triggers_are_typed_errors(tiny, make_llm):
    llm = make_llm(tiny["target"])
    with pytest.raises(InvalidOptionError, match="does not begin with its trigger 'the'"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=["the"])
    with pytest.raises(InvalidOptionError, match="non-empty strings"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=[""])
    with pytest.raises(InvalidOptionError, match="non-empty strings"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=[3])
    with pytest.raises(InvalidOptionError, match="need a grammar"):
        llm.generate("Hello", max_tokens=4, grammar_triggers=[TRIGGER])
    assert llm.generate("Hello", max_tokens=4).text  # the LLM goes on


def test_a_trigger_thousands_of_characters_into_the_reply(tiny, make_llm):
    """The wait is tracked beside llama.cpp's own (which keeps the whole text): a word first written after 4,200
    characters still starts the grammar where it is, and not before."""
    llm = make_llm(tiny["target"], n_ctx=8192)
    free = llm.generate("Hello world", max_tokens=4000)
    pieces = [llm.token_bytes(t).decode("ascii", "replace") for t in free.tokens]
    pos, word = 0, None
    for a, b in zip(pieces, pieces[1:]):
        w = a + b
        if pos > 4200 and len(w) >= 3 and w.isprintable() and '"' not in w and free.text.find(w) == pos:
            word = w
            break
        pos += len(a)
    assert word is not None
    grammar = 'root ::= "' + word.replace("\\", "\\\\") + '" (" " word){2}\nword ::= "the" | "in" | "an"'
    out = llm.generate("Hello world", max_tokens=4000, grammar=grammar, grammar_triggers=[word])
    assert out.text[:pos] == free.text[:pos] and out.finish_reason == "stop"
    assert re.fullmatch(re.escape(word) + r"( (the|in|an)){2}", out.text[pos:]), out.text[pos - 20:]


def test_bad_trigger_texts_are_typed_errors(tiny, make_llm):
    llm = make_llm(tiny["target"])
    with pytest.raises(InvalidOptionError, match="not valid Unicode"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=["\ud800"])
    with pytest.raises(InvalidOptionError, match="at most 256 characters, got one of 6000"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=[":T" * 3000])
    with pytest.raises(InvalidOptionError, match=r"does not begin with its trigger ':T:T:T.*\.\.\.'"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=[":T" * 128])
    assert llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_triggers=(TRIGGER,)).text


@pytest.mark.parametrize("draft", [None, "ngram", "near_draft"])
def test_trigger_patterns_as_llama_cpps(tiny, make_llm, free, plain, draft):
    """A pattern is searched in the output, or, written ^...$, matched against all of it; the grammar holds from
    its first group on: here both give what the word ":T" gives, and an anchored pattern the output's start does not
    match never fires."""
    llm = make_llm(tiny["target"], draft if draft in (None, "ngram") else tiny[draft])
    kw = dict(max_tokens=40, grammar=GRAMMAR, draft_length=4)
    for pattern in (r"(:T)", r"^aron(:T)[\s\S]*$", r"^\w+(:T)", r"^zzz|(:T)$", r"^zzz|(:T)"):
        out = llm.generate(PROMPTS[0], grammar_trigger_patterns=[pattern], **kw)
        assert (out.tokens, out.text) == (plain[PROMPTS[0]].tokens, plain[PROMPTS[0]].text), pattern
    out = llm.generate(PROMPTS[0], grammar_trigger_patterns=[r"^(:T)[\s\S]*$"], **kw)
    assert (out.tokens, out.text) == (free[PROMPTS[0]].tokens, free[PROMPTS[0]].text)


def test_a_bad_pattern_is_a_typed_error(tiny, make_llm):
    llm = make_llm(tiny["target"])
    with pytest.raises(InvalidOptionError, match=r"'\(:T' is not a regular expression"):
        llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, grammar_trigger_patterns=["(:T"])
    with pytest.raises(InvalidOptionError, match="need a grammar"):
        llm.generate("Hello", max_tokens=4, grammar_trigger_patterns=["x"])
    for bad in (dict(grammar_trigger_patterns=["(:T)\x00zzz"]), dict(grammar_triggers=[":T\x00"])):
        with pytest.raises(InvalidOptionError, match="NUL"):
            llm.generate("Hello", max_tokens=4, grammar=GRAMMAR, **bad)
    with pytest.raises(InvalidOptionError, match="NUL"):  # the core's own check, under the Python one
        llm._engine.target.check_grammar(GRAMMAR, [], ["(:T)\x00zzz"])
    assert llm.generate("Hello", max_tokens=4).text


def test_a_failed_trigger_leaves_no_text_behind_for_a_later_one(tiny, make_llm):
    """A reviewer's case: 'an' + 'ed' completes "ne", which the grammar cannot go on from ("d"); the text before
    'ed' stayed in llama.cpp's trigger buffer without 'ed', so the next 'e' made a "ne" the output does not hold and
    the grammar forced "!34" after "nede": a reply outside the grammar (6 of 292 triggers in a sweep)."""
    llm = make_llm(tiny["target"])
    triggered = 0
    for seed in (23, 5, 11, 40):
        out = llm.generate("the the in the an", max_tokens=150, temperature=1.0, seed=seed,
                           grammar='root ::= "ne" "!" [0-9]{2}', grammar_triggers=["ne"])
        if out.finish_reason == "stop":  # the grammar's text is whole: it holds from a "ne" the output holds
            triggered += 1
            assert re.search(r"ne![0-9]{2}$", out.text), (seed, out.text[-40:])
    assert triggered
    # a grammar with an anchored trigger pattern: after a failed trigger the wait could not restart without losing
    # where the output starts ("^\s*(e)" then fired mid-reply): such a grammar leaves the output free
    for seed in (23, 124):
        out = llm.generate("the the in the an", max_tokens=150, temperature=1.0, seed=seed,
                           grammar='root ::= ("ne" | "e") "!" [0-9]{2}', grammar_triggers=["ne"],
                           grammar_trigger_patterns=[r"^\s*(e)"])
        if out.finish_reason == "stop":
            assert re.search(r"(^\s*e|ne)![0-9]{2}$", out.text), (seed, out.text[-40:])
