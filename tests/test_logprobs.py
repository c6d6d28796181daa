"""Logprobs: each emitted token's log-probability under the target (log_softmax of its raw logits) and the most
likely tokens at its position. The reference is llama-cpp-python evaluating the same tokens with logits for every
position; speculative steps (draft model, n-gram, hybrid; exact and one-batch verification; greedy and sampling)
must report what plain decoding reports."""

import math

import numpy as np
import pytest

from specllm import InvalidOptionError, TokenLogprob

PROMPTS = ["Hello world", "def f(x):\n    return x * 2\n", "the the the the the the the the"]
N = 32
TOL = 0.01  # measured: plain decoding 0 from the reference; a verify batch's rows up to 0.0023 (a 5th token)


def reference(tiny, tokens, n_prompt):
    """log_softmax of the target's logits at every position from the last prompt token on, from llama-cpp-python
    evaluating the prompt but its last token in one batch and then one token at a time, as plain decoding does (a
    batch's rows round differently: up to 0.012 here). With flash attention and an F32 cache its logits equal
    specllm's for the tiny F32 model (measured: no difference); with its defaults they differ by up to 0.01."""
    import llama_cpp

    model = llama_cpp.Llama(model_path=tiny["target"], n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True,
                            flash_attn=True, type_k=0, type_v=0, verbose=False)  # 0: GGML_TYPE_F32
    try:
        model.eval(tokens[:n_prompt - 1])
        rows = []
        for t in tokens[n_prompt - 1:]:
            model.eval([t])
            rows.append(np.array(model.scores[model.n_tokens - 1], dtype=np.float64))
    finally:
        model.close()
    logits = np.array(rows)
    m = logits.max(axis=1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))


def check_against(ref, out, n_top, tol):
    """out's logprobs are the reference's at the positions that emitted them."""
    assert out.logprobs is not None and len(out.logprobs) == len(out.tokens) == N
    for i, e in enumerate(out.logprobs):
        row = ref[i]
        assert e.token == out.tokens[i]
        assert e.logprob <= 0 and abs(e.logprob - row[e.token]) < tol, (i, e.logprob, row[e.token])
        assert len(e.top) == n_top
        want = np.argsort(-row, kind="stable")[:n_top]
        for (t, lp), w in zip(e.top, want):
            # the same tokens, up to ties within the tolerance
            assert abs(lp - row[t]) < tol and abs(row[t] - row[w]) < tol, (i, e.top, list(want))
        assert [lp for _, lp in e.top] == sorted([lp for _, lp in e.top], reverse=True)


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    llm = make_llm(tiny["target"])
    out = {}
    for p in PROMPTS:
        c = llm.generate(p, max_tokens=N, logprobs=5)
        tokens = llm.prompt_tokens(p)
        out[p] = (c, reference(tiny, tokens + c.tokens, len(tokens)))
    return out


def test_plain_decoding_reports_the_models_distribution(plain):
    for p, (c, ref) in plain.items():
        check_against(ref, c, 5, TOL)
        for e in c.logprobs:  # greedy: the emitted token is the most likely one
            assert e.top[0] == (e.token, e.logprob)


@pytest.mark.parametrize("draft, llm_kw, gen_kw", [
    ("draft", {}, dict(draft_length=4)),
    ("near_draft", dict(exact=True), dict(draft_length=20)),  # verify chunks of <= 3 rows
    ("near_draft", {}, dict(draft_length=20)),  # one batch
    ("far_draft", {}, dict(draft_length=3)),  # mostly rejected
    ("ngram", {}, dict(draft_length=8)),
    ("near_draft", dict(ngram=True), dict(draft_length=6)),  # hybrid
])
def test_speculative_steps_report_what_plain_decoding_reports(tiny, make_llm, plain, draft, llm_kw, gen_kw):
    llm = make_llm(tiny["target"], tiny.get(draft, draft), **llm_kw)
    drafted = 0
    for p, (want, ref) in plain.items():
        c = llm.generate(p, max_tokens=N, logprobs=5, **gen_kw)
        assert c.tokens == want.tokens
        check_against(ref, c, 5, TOL)
        for e, w in zip(c.logprobs, want.logprobs):  # and what plain decoding reported
            assert abs(e.logprob - w.logprob) < TOL and [t for t, _ in e.top] == [t for t, _ in w.top], (e, w)
        drafted += c.stats.n_accepted
    assert drafted > 0  # accepted drafts were reported, not only the target's own tokens


def test_sampling_reports_the_raw_distribution(tiny, make_llm):
    """temperature, top-k and top-p change what is drawn, not the logprobs reported (temperature 1, untruncated)."""
    llm = make_llm(tiny["target"], tiny["near_draft"])
    p = PROMPTS[0]
    c = llm.generate(p, max_tokens=N, logprobs=3, temperature=1.5, top_k=5, top_p=0.9, seed=7, draft_length=4)
    assert c.stats.n_accepted > 0
    tokens = llm.prompt_tokens(p)
    check_against(reference(tiny, tokens + c.tokens, len(tokens)), c, 3, TOL)


def test_streams_carry_one_entry_per_token(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["draft"])
    chunks = list(llm.stream(PROMPTS[1], max_tokens=N, logprobs=0, draft_length=4))
    assert all(len(ch.logprobs) == len(ch.tokens) for ch in chunks)
    assert sum(len(ch.tokens) for ch in chunks) == N
    assert all(isinstance(e, TokenLogprob) and e.top == [] and math.isfinite(e.logprob)
               for ch in chunks for e in ch.logprobs)
    assert all(ch.logprobs is None for ch in llm.stream(PROMPTS[1], max_tokens=8))
    assert llm.generate(PROMPTS[1], max_tokens=8).logprobs is None


def test_a_stop_string_keeps_tokens_and_logprobs_together(tiny, make_llm, plain):
    llm = make_llm(tiny["target"], "ngram")
    full = plain[PROMPTS[2]][0]
    stop = full.text[10:13]
    c = llm.generate(PROMPTS[2], max_tokens=N, logprobs=2, stop=stop)
    assert c.finish_reason == "stop" and len(c.logprobs) == len(c.tokens) < N
    assert [e.token for e in c.logprobs] == c.tokens == full.tokens[:len(c.tokens)]


@pytest.mark.parametrize("value, error", [
    (-1, InvalidOptionError), (21, InvalidOptionError), (True, TypeError), ("5", TypeError), (2.0, TypeError),
])
def test_bad_logprobs_values(tiny, make_llm, value, error):
    llm = make_llm(tiny["target"])
    with pytest.raises(error, match="logprobs"):
        llm.generate("hi", max_tokens=2, logprobs=value)
    assert llm.generate("hi", max_tokens=2, logprobs=20).logprobs[0].top.__len__() == 20


def test_token_bytes(tiny, make_llm):
    llm = make_llm(tiny["target"])
    tokens = llm.tokenize("naïve café", add_special=False)
    assert b"".join(llm.token_bytes(t) for t in tokens) == llm.detokenize(tokens).encode("utf-8")
    assert "naïve café" in llm.detokenize(tokens)
    with pytest.raises(InvalidOptionError):
        llm.token_bytes(10**6)
    with pytest.raises(TypeError):
        llm.token_bytes("a")
