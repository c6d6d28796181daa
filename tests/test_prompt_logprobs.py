"""prompt_logprobs: each prompt token's log-probability after the tokens before it (the first has none), as an eval
harness scores a text (lm-eval's loglikelihood through /v1/completions with echo and logprobs). The reference is
llama-cpp-python evaluating the prompt with logits for every position; max_tokens=0 processes the prompt only."""

import numpy as np
import pytest

from specllm import InvalidOptionError, TokenLogprob

LONG = "def f(x):\n    return x * 2\n" * 12  # over 2 x 64 tokens: several scoring batches
PROMPTS = ["Hello world", "the the the the the the the the", LONG]
TOL = 0.01  # as test_logprobs (measured: the same batches give the same numbers)


def reference(tiny, tokens):
    """log_softmax of the target's logits at positions 0..n-2, llama-cpp-python evaluating the tokens in batches of
    64 as specllm scores them (flash attention and an F32 cache, as specllm's tiny-model LLMs)."""
    import llama_cpp

    model = llama_cpp.Llama(model_path=tiny["target"], n_ctx=512, n_batch=64, n_threads=1, n_threads_batch=1,
                            logits_all=True, flash_attn=True, type_k=0, type_v=0, verbose=False)  # 0: GGML_TYPE_F32
    try:
        model.eval(tokens)
        logits = np.array(model.scores[:len(tokens) - 1], dtype=np.float64)
    finally:
        model.close()
    m = logits.max(axis=1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))


def check(ref, tokens, entries, n_top):
    assert len(entries) == len(tokens) and entries[0] is None
    for i, e in enumerate(entries[1:]):
        row = ref[i]
        assert isinstance(e, TokenLogprob) and e.token == tokens[i + 1]
        assert e.logprob <= 0 and abs(e.logprob - row[e.token]) < TOL, (i, e.logprob, row[e.token])
        assert len(e.top) == n_top
        want = np.argsort(-row, kind="stable")[:n_top]
        for (t, lp), w in zip(e.top, want):
            assert abs(lp - row[t]) < TOL and abs(row[t] - row[w]) < TOL, (i, e.top, list(want))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_prompts_tokens_are_scored_as_the_model_sees_them(tiny, make_llm, prompt):
    llm = make_llm(tiny["target"])
    tokens = llm.prompt_tokens(prompt)
    c = llm.generate(prompt, max_tokens=0, prompt_logprobs=3)
    assert (c.text, c.tokens, c.finish_reason, c.stats.n_generated) == ("", [], "length", 0)
    check(reference(tiny, tokens), tokens, c.prompt_logprobs, 3)
    if prompt == LONG:
        assert len(tokens) > 2 * 64


@pytest.mark.parametrize("draft, kw", [(None, {}), ("near_draft", dict(draft_length=6)), ("ngram", {}),
                                       ("near_draft", dict(ngram=True))])
def test_a_scored_prompt_generates_what_an_unscored_one_does(tiny, make_llm, draft, kw):
    """The prompt is decoded again in scoring batches; the reply that follows is the same, drafted or not."""
    llm_kw = {"ngram": kw.pop("ngram")} if "ngram" in kw else {}
    llm = make_llm(tiny["target"], tiny.get(draft, draft), **llm_kw)
    for p in PROMPTS:
        want = llm.generate(p, max_tokens=24, logprobs=2, **kw)
        got = llm.generate(p, max_tokens=24, logprobs=2, prompt_logprobs=1, **kw)
        assert got.tokens == want.tokens and got.text == want.text
        assert [e.token for e in got.logprobs] == [e.token for e in want.logprobs]
        assert all(abs(a.logprob - b.logprob) < TOL for a, b in zip(got.logprobs, want.logprobs))
        assert len(got.prompt_logprobs) == got.stats.n_prompt and want.prompt_logprobs is None
        assert got.stats.n_cached == 0  # nothing reused: every row's logits were needed


def test_the_scored_prompt_stays_cached_for_the_next_call(tiny, make_llm):
    llm = make_llm(tiny["target"])
    first = llm.generate(LONG, max_tokens=0, prompt_logprobs=0)
    again = llm.generate(LONG, max_tokens=4)
    assert again.stats.n_cached == again.stats.n_prompt - 1 == len(first.prompt_logprobs) - 1
    assert all(e.top == [] for e in first.prompt_logprobs[1:])


def test_a_one_token_prompt_has_nothing_to_score(tiny, make_llm):
    llm = make_llm(tiny["target"])
    tokens = llm.prompt_tokens("Hello")[:1]
    c = llm.generate(tokens, max_tokens=3, prompt_logprobs=2)
    assert c.prompt_logprobs == [None] and len(c.tokens) == 3


def test_the_first_chunk_of_a_stream_carries_them(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["draft"])
    with llm.stream(PROMPTS[1], max_tokens=8, prompt_logprobs=1, draft_length=3) as s:
        chunks = list(s)
    assert chunks[0].prompt_logprobs is s.prompt_logprobs and len(s.prompt_logprobs) == s.stats.n_prompt
    assert all(ch.prompt_logprobs is None for ch in chunks[1:])
    with llm.stream(PROMPTS[1], max_tokens=0, prompt_logprobs=0) as s:
        (only,) = list(s)
    assert only.finish_reason == "length" and only.prompt_logprobs == s.prompt_logprobs
    s = llm.stream(PROMPTS[1], max_tokens=4, prompt_logprobs=0)
    s.cancel()  # before the prompt is processed: cancelled, nothing scored
    assert [ch.finish_reason for ch in s] == ["cancelled"] and s.prompt_logprobs is None


def test_max_tokens_0_without_scoring_processes_the_prompt(tiny, make_llm):
    llm = make_llm(tiny["target"], "ngram")
    c = llm.generate(LONG, max_tokens=0)
    assert (c.text, c.finish_reason, c.prompt_logprobs, c.stats.n_steps) == ("", "length", None, 0)
    assert llm.generate(LONG, max_tokens=2).stats.n_cached == c.stats.n_prompt - 1  # a warmed cache


@pytest.mark.parametrize("options, error, match", [
    (dict(prompt_logprobs=-1), InvalidOptionError, r"prompt_logprobs must be >= 0"),
    (dict(prompt_logprobs=21), InvalidOptionError, r"prompt_logprobs must be at most 20"),
    (dict(prompt_logprobs=True), TypeError, r"prompt_logprobs must be an int"),
    (dict(prompt_logprobs="1"), TypeError, r"prompt_logprobs must be an int"),
    (dict(max_tokens=-1), InvalidOptionError, r"max_tokens must be >= 0 \(0: process the prompt only\)"),
])
def test_bad_values(tiny, make_llm, options, error, match):
    llm = make_llm(tiny["target"])
    with pytest.raises(error, match=match):
        llm.generate("hi", **options)
    assert llm.generate("hi", max_tokens=1, prompt_logprobs=20).prompt_logprobs[1].top.__len__() == 20


def test_a_scoring_call_sets_the_conversations_cache_aside(tiny, make_llm):
    """Scoring clears the live KV cache: with a prompt cache (the default), the conversation it held is saved first
    and restored by the conversation's next call."""
    llm = make_llm(tiny["target"])
    chat = LONG + "and then"
    llm.generate(chat, max_tokens=8)
    llm.generate("Hello world, how are you", max_tokens=0, prompt_logprobs=1)
    again = llm.generate(chat, max_tokens=8)
    assert again.stats.n_restored == again.stats.n_cached >= again.stats.n_prompt - 1 - 8
    cold = make_llm(tiny["target"], prompt_cache_mb=0)
    cold.generate(chat, max_tokens=8)
    cold.generate("Hello world, how are you", max_tokens=0, prompt_logprobs=1)
    assert cold.generate(chat, max_tokens=8).stats.n_cached <= 2  # without one it is gone (a shared first token)
