"""Repetition penalties (repeat_penalty, frequency_penalty, presence_penalty over the last penalty_last_n tokens of
prompt and output), as llama.cpp's penalties sampler applies them. The reference is llama-cpp-python evaluating one
token at a time, with the penalties applied to each row in numpy; speculative decoding under penalties (each verify
row penalized by the context up to it) must write plain decoding's text."""

import math

import numpy as np
import pytest

from specllm import InvalidOptionError

PROMPT = "the the in the an"
CONFIGS = [  # each changes the tiny target's greedy reply to PROMPT
    dict(repeat_penalty=1.5),
    dict(frequency_penalty=0.6, presence_penalty=0.4, penalty_last_n=-1),
    dict(repeat_penalty=1.4, frequency_penalty=0.2, penalty_last_n=6),  # tokens leave the short window
]


def penalize(row, window, repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0):
    row = row.copy()  # float32, as llama.cpp's logits
    ids, counts = np.unique(np.array(window, dtype=np.int64), return_counts=True)
    for t, c in zip(ids, counts):
        v = row[t]
        v = v * np.float32(repeat_penalty) if v <= 0 else v / np.float32(repeat_penalty)
        row[t] = v - (np.float32(c) * np.float32(frequency_penalty) + np.float32(presence_penalty))
    return row


def reference_greedy(tiny, llm, prompt, max_tokens=40, penalty_last_n=64, logit_bias=None, **penalties):
    import llama_cpp

    tokens = llm.prompt_tokens(prompt)
    model = llama_cpp.Llama(model_path=tiny["target"], n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True,
                            flash_attn=True, type_k=0, type_v=0, verbose=False)
    eos = model.token_eos()
    try:
        model.eval(tokens[:-1])
        context, out, last = list(tokens), [], tokens[-1]
        for _ in range(max_tokens):
            model.eval([last])
            row = np.array(model.scores[model.n_tokens - 1], dtype=np.float32)
            window = context[max(0, len(context) - penalty_last_n):] if penalty_last_n > 0 else context
            window = window if penalty_last_n else []
            row = penalize(row, window, **penalties)
            for t, b in (logit_bias or {}).items():  # after the penalties (test_logit_bias)
                row[t] += np.float32(b)
            last = int(np.argmax(row))
            if last == eos:
                break
            out.append(last)
            context.append(last)
    finally:
        model.close()
    return out


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    llm = make_llm(tiny["target"])
    return llm, [llm.generate(PROMPT, max_tokens=40, **c) for c in CONFIGS], llm.generate(PROMPT, max_tokens=40)


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_greedy_as_the_reference(tiny, plain, i):
    llm, outs, free = plain
    assert outs[i].tokens == reference_greedy(tiny, llm, PROMPT, **CONFIGS[i])
    assert outs[i].tokens != free.tokens  # the penalties changed the reply


def test_off_values_change_nothing(tiny, make_llm, plain):
    llm, _, free = plain
    for off in (dict(repeat_penalty=1.0), dict(penalty_last_n=0, repeat_penalty=1.5, presence_penalty=1.0),
                dict(frequency_penalty=0.0, presence_penalty=0.0)):
        assert llm.generate(PROMPT, max_tokens=40, **off).tokens == free.tokens
    assert free.tokens == reference_greedy(tiny, llm, PROMPT)


def speculative_as_plain(tiny, make_llm, drafter, runs):
    """Speculative greedy (k = 4 and "auto") under each of runs' options writes plain decoding's tokens; (drafted,
    accepted) over them all. runs: [(generate's options, plain decoding's Completion)]."""
    if drafter == "ngram":
        llm = make_llm(tiny["target"], "ngram")
    else:
        llm = make_llm(tiny["target"], tiny["near_draft"], ngram=drafter == "hybrid")
    drafted = accepted = 0
    for c, want in runs:
        for k in (4, "auto"):
            out = llm.generate(PROMPT, max_tokens=40, draft_length=k, **c)
            assert out.tokens == want.tokens, (c, k)
            drafted += out.stats.n_drafted
            accepted += out.stats.n_accepted
    return drafted, accepted


@pytest.mark.parametrize("drafter", ["near_draft", "ngram", "hybrid"])
def test_speculative_greedy_writes_plain_decodings_text(tiny, make_llm, plain, drafter):
    _, outs, _ = plain
    drafted, accepted = speculative_as_plain(tiny, make_llm, drafter, list(zip(CONFIGS, outs)))
    assert drafted > 0 and accepted > 0  # rows after accepted drafts were penalized by them


def test_speculative_sampling_writes_plain_samplings_text(tiny, make_llm):
    plain = make_llm(tiny["target"])
    spec = make_llm(tiny["target"], tiny["near_draft"])
    options = dict(max_tokens=40, temperature=0.9, seed=7, repeat_penalty=1.3, frequency_penalty=0.3)
    want = plain.generate(PROMPT, **options)
    assert want.tokens != plain.generate(PROMPT, **dict(options, repeat_penalty=1.0, frequency_penalty=0.0)).tokens
    out = spec.generate(PROMPT, draft_length=4, **options)
    assert out.tokens == want.tokens and out.stats.n_accepted > 0


def test_the_draft_model_drafts_under_the_penalties(tiny, make_llm):
    # the target drafting for itself guesses every token only if it drafts under the same penalties (its free
    # guesses miss where the penalties move the target's choice)
    llm = make_llm(tiny["target"], tiny["target"], exact=True)
    for c in CONFIGS:
        out = llm.generate(PROMPT, max_tokens=40, draft_length=4, **c)
        assert out.stats.n_drafted > 20 and out.stats.acceptance_rate == 1.0, (c, out.stats.acceptance_rate)


def test_logprobs_stay_the_models_own(tiny, plain):
    from test_logprobs import reference

    llm = plain[0]
    out = llm.generate(PROMPT, max_tokens=24, logprobs=0, **CONFIGS[0])
    tokens = llm.prompt_tokens(PROMPT)
    ref = reference(tiny, tokens + out.tokens, len(tokens))
    assert all(abs(e.logprob - ref[i][e.token]) < 0.01 for i, e in enumerate(out.logprobs))
    assert any(e.token != int(np.argmax(ref[i])) for i, e in enumerate(out.logprobs))  # the penalties chose


def test_a_grammar_under_the_penalties(tiny, make_llm):
    grammar = 'root ::= word (" " word){7}\nword ::= "the" | "in" | "an"'
    plain = make_llm(tiny["target"])
    options = dict(max_tokens=40, grammar=grammar, repeat_penalty=3.0, frequency_penalty=1.0)
    want = plain.generate(PROMPT, **options)
    assert want.text != plain.generate(PROMPT, max_tokens=40, grammar=grammar).text
    spec = make_llm(tiny["target"], tiny["near_draft"], ngram=True)
    for k in (4, "auto"):
        out = spec.generate(PROMPT, draft_length=k, **options)
        assert out.tokens == want.tokens and (k == "auto" or out.stats.n_accepted > 0), (k, out.stats.n_accepted)


@pytest.mark.parametrize("options, message", [
    (dict(repeat_penalty=0), "repeat_penalty must be a finite number > 0"),
    (dict(repeat_penalty=-1.1), "repeat_penalty must be a finite number > 0"),
    (dict(repeat_penalty=math.inf), "repeat_penalty must be a finite number > 0"),
    (dict(repeat_penalty=math.nan), "repeat_penalty must be a finite number > 0"),
    (dict(frequency_penalty=math.nan), "frequency_penalty must be a finite number"),
    (dict(presence_penalty=-math.inf), "presence_penalty must be a finite number"),
    (dict(penalty_last_n=-2), "penalty_last_n must be >= -1"),
])
def test_bad_values(tiny, plain, options, message):
    llm = plain[0]
    with pytest.raises(InvalidOptionError, match=message):
        llm.generate(PROMPT, max_tokens=4, **options)


@pytest.mark.parametrize("options", [dict(repeat_penalty="1.1"), dict(presence_penalty=None),
                                     dict(penalty_last_n=6.0), dict(penalty_last_n=True)])
def test_bad_types(tiny, plain, options):
    with pytest.raises(TypeError):
        plain[0].generate(PROMPT, max_tokens=4, **options)
