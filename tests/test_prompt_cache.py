"""The prompt cache: KV states of earlier prompts, restored when a prompt continues a conversation other than the
last one (an assistant's title request between two turns, interleaved agents). The restored prefix is not decoded
again, and the output is what it would have been: the same as an LLM that never switched."""

import pytest

import specllm
from helpers import check_kv

N = 24


def long_prompt(llm, text):
    tokens = llm.tokenize(text * 40)
    assert len(tokens) >= 128  # twice the least a saved state must give (PromptCache::min_tokens)
    return tokens


@pytest.fixture(scope="module")
def prompts(tiny, make_llm):
    llm = make_llm(tiny["target"])
    return {name: long_prompt(llm, text) for name, text in (("a", "Hello world "), ("b", "the cat sat "),
                                                           ("c", "on a mat and "))}


def next_turn(prompt, reply, more):
    return list(prompt) + list(reply.tokens) + list(more)


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_a_conversation_taken_up_again_reuses_its_prefix_and_writes_the_same(tiny, make_llm, prompts, draft):
    def make(**kw):
        if draft == "model":
            return make_llm(tiny["target"], tiny["near_draft"], **kw)
        return make_llm(tiny["target"], draft, **kw)

    a, b = prompts["a"], prompts["b"]
    llm, off = make(), make(prompt_cache_mb=0)
    runs = {}
    for name, x in (("on", llm), ("off", off)):
        opts = dict(max_tokens=N) if draft is None else dict(max_tokens=N, draft_length=4)
        a1 = x.generate(a, **opts)
        x.generate(b, **opts)  # another conversation in between: the live cache now holds b
        a2 = next_turn(a, a1, b[:5])
        runs[name] = (a1, a2, x.generate(a2, **opts))
    a1, a2, on = runs["on"]
    assert on.stats.n_restored == on.stats.n_cached >= len(a) + len(a1.tokens) - 1, on.stats
    assert runs["off"][2].stats.n_restored == 0 and runs["off"][2].stats.n_cached < len(a) // 2
    fresh = make(prompt_cache_mb=0).generate(a2, max_tokens=N, **({} if draft is None else {"draft_length": 4}))
    assert on.tokens == runs["off"][2].tokens == fresh.tokens
    check_kv(llm, a2, on)
    assert llm._engine.prompt_cache_entries >= 1 and off._engine.prompt_cache_entries == 0


def test_a_conversation_that_goes_on_saves_nothing(tiny, make_llm, prompts):
    llm = make_llm(tiny["target"])
    prompt = prompts["a"]
    for _ in range(3):  # each turn extends the last: the live cache is only extended, nothing is copied out
        reply = llm.generate(prompt, max_tokens=N)
        assert reply.stats.n_restored == 0
        prompt = next_turn(prompt, reply, prompts["c"][:3])
    assert llm._engine.prompt_cache_entries == 0 and llm._engine.prompt_cache_used == 0


def test_the_cache_is_bounded_least_recently_used_out_first(tiny, make_llm, prompts):
    llm = make_llm(tiny["target"])
    for p in ("a", "b", "c"):
        llm.generate(prompts[p], max_tokens=N)
    one = llm._engine.prompt_cache_used // llm._engine.prompt_cache_entries  # the states are about the same size
    assert llm._engine.prompt_cache_entries == 2  # a and b, cut away by the prompt after each
    llm._engine.set_prompt_cache_bytes(int(1.5 * one))  # room for one: the least recently used (a) goes
    assert llm._engine.prompt_cache_entries == 1 and llm._engine.prompt_cache_used <= 1.5 * one
    assert llm.generate(prompts["b"], max_tokens=N).stats.n_restored > 0   # b was kept (c saved in its place) ...
    assert llm.generate(prompts["a"], max_tokens=N).stats.n_restored == 0  # ... a is gone
    llm._engine.set_prompt_cache_bytes(one // 2)  # smaller than any state: none is kept
    assert llm._engine.prompt_cache_entries == 0
    llm.generate(prompts["c"], max_tokens=N)
    assert llm._engine.prompt_cache_entries == 0 and llm._engine.prompt_cache_used == 0


def test_reset_empties_it(tiny, make_llm, prompts):
    llm = make_llm(tiny["target"])
    llm.generate(prompts["a"], max_tokens=N)
    llm.generate(prompts["b"], max_tokens=N)
    assert llm._engine.prompt_cache_entries == 1
    llm.reset()
    assert llm._engine.prompt_cache_entries == 0 and llm._engine.prompt_cache_used == 0
    c = llm.generate(prompts["a"], max_tokens=N)
    assert c.stats.n_cached == c.stats.n_restored == 0


def test_a_recurrent_model_keeps_no_states(tiny, make_llm, prompts):
    with make_llm(tiny["recurrent"]) as llm:
        ref = {p: make_llm(tiny["recurrent"], prompt_cache_mb=0).generate(prompts[p][:80], max_tokens=12).tokens
               for p in ("a", "b")}
        for p in ("a", "b", "a"):
            assert llm.generate(prompts[p][:80], max_tokens=12).tokens == ref[p]
        assert llm._engine.prompt_cache_entries == 0


@pytest.mark.parametrize("value, error", [(-1, specllm.InvalidOptionError), ("512", TypeError),
                                          (1.5, TypeError), (True, TypeError)])
def test_bad_sizes(tiny, value, error):
    with pytest.raises(error, match="prompt_cache_mb"):
        specllm.LLM(tiny["target"], None, prompt_cache_mb=value, profile_costs=False)
