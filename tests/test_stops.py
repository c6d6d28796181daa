"""Where a generation ends: max_tokens, the model's end-of-generation token, stop strings (also inside a multi-token
speculative step and across two steps). Each ending leaves the LLM with a consistent KV cache."""

import pytest

from helpers import check_kv, check_stats

PROMPT = "Hello world"
N = 40

# (name, draft role / "ngram" / None, ngram flag, draft_length)
DRAFTERS = [
    ("plain", None, False, 0),
    ("draft", "draft", False, 3),
    ("same-k8", "target", False, 8),  # everything accepted: a stop falls inside a 9-token commit
    ("near", "near_draft", False, 4),
    ("ngram", "ngram", False, 4),
    ("hybrid", "near_draft", True, "heuristic"),
]
IDS = [d[0] for d in DRAFTERS]


def load(tiny, make_llm, drafter, target=None):
    _, draft, ngram, _ = drafter
    return make_llm(target or tiny["target"], tiny.get(draft, draft), ngram=ngram)


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    return make_llm(tiny["target"]).generate(PROMPT, max_tokens=N)


@pytest.mark.parametrize("drafter", DRAFTERS, ids=IDS)
@pytest.mark.parametrize("max_tokens", [1, 2, 7, 33])
def test_max_tokens_gives_exactly_that_many(tiny, make_llm, plain, drafter, max_tokens):
    llm = load(tiny, make_llm, drafter)
    c = llm.generate(PROMPT, max_tokens=max_tokens, draft_length=drafter[3])
    assert c.finish_reason == "length"
    assert c.tokens == plain.tokens[:max_tokens]
    check_stats(c)
    check_kv(llm, llm.tokenize(PROMPT), c)


@pytest.fixture(scope="module")
def eos_set(tiny, plain, tmp_path_factory):
    """Target and draft whose EOS token is the token plain decoding emits at position i >= 5 (its first occurrence).
    The weights do not depend on eos_token_id, so up to that token they generate exactly what the standard set does."""
    from models.tiny import STANDARD_SET, write_tiny_model

    i = next(i for i in range(5, N) if plain.tokens[i] not in plain.tokens[:i])
    eos = plain.tokens[i]
    d = tmp_path_factory.mktemp("eos")
    paths = {
        "target": write_tiny_model(d / "target.gguf", **STANDARD_SET["target"], eos_token_id=eos),
        "draft": write_tiny_model(d / "draft.gguf", **STANDARD_SET["draft"], eos_token_id=eos),
    }
    paths["near_draft"] = paths["draft"]  # a noisy copy would have the standard EOS: use the eos draft instead
    return paths, i, eos


@pytest.mark.parametrize("drafter", DRAFTERS, ids=IDS)
def test_end_of_generation_token_stops_and_is_not_emitted(tiny, make_llm, plain, eos_set, drafter):
    paths, i, eos = eos_set
    name, draft, ngram, k = drafter
    llm = make_llm(paths["target"], paths.get(draft, draft), ngram=ngram)
    c = llm.generate(PROMPT, max_tokens=N, draft_length=k)
    assert c.finish_reason == "stop"
    assert c.tokens == plain.tokens[:i] and eos not in c.tokens
    assert c.text == llm.detokenize(plain.tokens[:i])
    check_stats(c, exact_steps=False)
    check_kv(llm, llm.tokenize(PROMPT), c)
    # ignore_eos: the same model goes on past its EOS token like the standard target
    more = llm.generate(PROMPT, max_tokens=N, draft_length=k, ignore_eos=True)
    assert more.tokens == plain.tokens and more.finish_reason == "length"
    # and the LLM is consistent afterwards: a longer prompt gives what a fresh LLM gives
    longer = PROMPT + c.text + " again"
    assert (llm.generate(longer, max_tokens=N, draft_length=k).tokens
            == make_llm(paths["target"]).generate(longer, max_tokens=N).tokens)


def cut(text, stops):
    """text cut before the earliest occurrence of any stop string."""
    positions = [text.find(s) for s in stops if s in text]
    return text[:min(positions)] if positions else text


@pytest.fixture(scope="module")
def stop_cases(tiny, make_llm, plain):
    """Stop strings chosen from the plain output: (name, stops)."""
    llm = make_llm(tiny["target"])
    text = plain.text
    assert "\ufffd" not in text[:30], "choose another PROMPT: the stop strings below must be clean text"
    pieces = [llm.detokenize([t]) for t in plain.tokens]
    # a 2-character stop string made of the last character of one token and the first of the next, whose first
    # occurrence in the text is exactly there: it straddles two plain decoding steps
    straddle, ends = None, 0
    for a, b in zip(pieces, pieces[1:]):
        ends += len(a)
        s = a[-1:] + b[:1]
        if ends > 8 and len(s) == 2 and s.isprintable() and text.find(s) == ends - 1:
            straddle = s
            break
    assert straddle, pieces
    mid, late = text[12:15], text[25:27]
    return [
        ("middle", [mid]),
        ("straddle", [straddle]),
        ("first-char", [text[0]]),
        ("earliest-wins", [late, mid, "never occurs \u2603"]),
        ("absent", ["never occurs \u2603"]),
        ("only-in-the-prompt", ["world"]),  # the prompt's text never stops the generation
    ]


@pytest.mark.parametrize("drafter", DRAFTERS, ids=IDS)
def test_stop_strings_cut_the_text_exactly(tiny, make_llm, plain, stop_cases, drafter):
    llm = load(tiny, make_llm, drafter)
    for name, stops in stop_cases:
        want = cut(plain.text, stops)
        stopped = any(s in plain.text for s in stops)
        c = llm.generate(PROMPT, max_tokens=N, stop=stops, draft_length=drafter[3])
        assert c.text == want, (name, stops)
        assert c.finish_reason == ("stop" if stopped else "length"), name
        assert c.tokens == plain.tokens[:len(c.tokens)]
        assert llm.detokenize(c.tokens).startswith(want)
        if stopped:  # generation ended with the token that completed a stop string, not later
            assert any(s in llm.detokenize(c.tokens) for s in stops)
            assert not any(s in llm.detokenize(c.tokens[:-1]) for s in stops)
        check_stats(c, exact_steps=not stopped)
        check_kv(llm, llm.tokenize(PROMPT), c)
        # streaming releases nothing of the stop string, even when it arrives in two steps
        chunks = list(llm.stream(PROMPT, max_tokens=N, stop=stops, draft_length=drafter[3]))
        assert "".join(ch.text for ch in chunks) == want, (name, [ch.text for ch in chunks])
        assert [t for ch in chunks for t in ch.tokens] == c.tokens


def test_a_stop_string_also_cuts_the_kv_for_the_next_turn(tiny, make_llm, plain, stop_cases):
    llm = make_llm(tiny["target"], tiny["target"])
    stops = dict(stop_cases)["middle"]
    c = llm.generate(PROMPT, max_tokens=N, stop=stops, draft_length=8)
    nxt = PROMPT + c.text + stops[0] + " and on"
    again = llm.generate(nxt, max_tokens=N, draft_length=8)
    assert again.tokens == make_llm(tiny["target"]).generate(nxt, max_tokens=N).tokens
    assert again.stats.n_cached > 0
