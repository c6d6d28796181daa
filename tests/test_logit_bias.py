"""logit_bias ({token id: bias} added to the logits after the penalties; OpenAI's and llama-server's): the reference
is llama-cpp-python evaluating one token at a time with the bias added in numpy; speculative decoding under a bias
must write plain decoding's text (the draft model drafts under it too)."""

import math

import numpy as np
import pytest

from specllm import InvalidOptionError
from test_penalties import PROMPT, reference_greedy, speculative_as_plain


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    llm = make_llm(tiny["target"])
    free = llm.generate(PROMPT, max_tokens=40)
    # ban the reply's two commonest tokens, favour a third the reply never writes
    ids, counts = np.unique(free.tokens, return_counts=True)
    common = [int(t) for t in ids[np.argsort(-counts)][:2]]
    unused = next(t for t in range(5, 200) if t not in free.tokens)
    configs = [{common[0]: -100.0}, {common[0]: float("-inf"), common[1]: -5.0, unused: 3.0}]
    return llm, free, configs, [llm.generate(PROMPT, max_tokens=40, logit_bias=c) for c in configs]


def test_greedy_as_the_reference(tiny, plain):
    llm, free, configs, outs = plain
    for c, out in zip(configs, outs):
        assert out.tokens == reference_greedy(tiny, llm, PROMPT, logit_bias=c)
        assert out.tokens != free.tokens
        banned = [t for t, b in c.items() if b <= -100]
        assert not set(banned) & set(out.tokens)


def test_a_large_bias_forces_the_token(tiny, plain):
    llm, free, _, _ = plain
    unused = next(t for t in range(5, 200) if t not in free.tokens)
    out = llm.generate(PROMPT, max_tokens=12, logit_bias={unused: 100.0})
    assert out.tokens == [unused] * 12


def test_with_the_penalties(tiny, plain):
    llm, _, configs, _ = plain
    out = llm.generate(PROMPT, max_tokens=40, logit_bias=configs[1], repeat_penalty=1.3)
    assert out.tokens == reference_greedy(tiny, llm, PROMPT, logit_bias=configs[1], repeat_penalty=1.3)


def test_empty_or_zero_changes_nothing(plain):
    llm, free, _, _ = plain
    assert llm.generate(PROMPT, max_tokens=40, logit_bias={}).tokens == free.tokens
    assert llm.generate(PROMPT, max_tokens=40, logit_bias={free.tokens[0]: 0.0}).tokens == free.tokens


@pytest.mark.parametrize("drafter", ["near_draft", "ngram", "hybrid"])
def test_speculative_greedy_writes_plain_decodings_text(tiny, make_llm, plain, drafter):
    _, _, configs, outs = plain
    runs = [({"logit_bias": c}, want) for c, want in zip(configs, outs)]
    drafted, accepted = speculative_as_plain(tiny, make_llm, drafter, runs)
    assert drafted > 0 and accepted > 0


def test_speculative_sampling_writes_plain_samplings_text(tiny, make_llm, plain):
    _, _, configs, _ = plain
    plain_llm = make_llm(tiny["target"])
    spec = make_llm(tiny["target"], tiny["near_draft"])
    options = dict(max_tokens=40, temperature=0.9, seed=11)
    want = plain_llm.generate(PROMPT, logit_bias=configs[1], **options)
    assert want.tokens != plain_llm.generate(PROMPT, **options).tokens
    out = spec.generate(PROMPT, draft_length=4, logit_bias=configs[1], **options)
    assert out.tokens == want.tokens and out.stats.n_accepted > 0


def test_the_draft_model_drafts_under_the_bias(tiny, make_llm, plain):
    # the target drafting for itself guesses every token only if it drafts under the same bias
    _, _, configs, _ = plain
    llm = make_llm(tiny["target"], tiny["target"], exact=True)
    for c in configs:
        out = llm.generate(PROMPT, max_tokens=40, draft_length=4, logit_bias=c)
        assert out.stats.n_drafted > 20 and out.stats.acceptance_rate == 1.0, (c, out.stats.acceptance_rate)


def test_logprobs_stay_the_models_own(tiny, plain):
    from test_logprobs import reference

    llm, _, configs, _ = plain
    out = llm.generate(PROMPT, max_tokens=24, logprobs=0, logit_bias=configs[0])
    tokens = llm.prompt_tokens(PROMPT)
    ref = reference(tiny, tokens + out.tokens, len(tokens))
    assert all(abs(e.logprob - ref[i][e.token]) < 0.01 for i, e in enumerate(out.logprobs))


@pytest.mark.parametrize("bias, error, match", [
    ([(5, 1.0)], TypeError, "dict of token id"),
    ({"5": 1.0}, TypeError, "keys are token ids"),
    ({True: 1.0}, TypeError, "keys are token ids"),
    ({-1: 1.0}, InvalidOptionError, "not in the model's vocabulary"),
    ({10**9: 1.0}, InvalidOptionError, "not in the model's vocabulary"),
    ({5: float("nan")}, InvalidOptionError, "finite number"),
    ({5: math.inf}, InvalidOptionError, "finite number"),
    ({5: 1e308}, InvalidOptionError, r"logit_bias\[5\] must be a finite number"),  # inf as the core's float32
    ({5: "1"}, TypeError, "must be a number"),
    ({5: None}, TypeError, "must be a number"),
])
def test_bad_logit_bias_is_a_typed_error(plain, bias, error, match):
    llm, free, _, _ = plain
    with pytest.raises(error, match=match):
        llm.generate(PROMPT, max_tokens=4, logit_bias=bias)
    assert llm.generate(PROMPT, max_tokens=40).tokens == free.tokens  # the LLM goes on as before


@pytest.mark.parametrize("ban", [float("-inf"), -1e300])  # -1e300: -inf as the float the core adds
def test_banning_every_token_is_refused(tiny, make_llm, ban):
    """-inf on every token of the vocabulary generated token 0 (itself banned) at every step, without a word."""
    llm = make_llm(tiny["target"])
    n_vocab = llm._engine.target.n_vocab
    with pytest.raises(InvalidOptionError, match=rf"logit_bias bans every token of the vocabulary \(-inf on "
                                                         rf"all {n_vocab}\)"):
        llm.generate("hello", max_tokens=4, logit_bias={t: ban for t in range(n_vocab)})
    almost = {t: float("-inf") for t in range(1, n_vocab)}  # one left: it is the only token generated
    assert set(llm.generate("hello", max_tokens=4, logit_bias=almost, ignore_eos=True).tokens) == {0}
