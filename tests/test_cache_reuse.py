"""cache_reuse=n (llama-server's --cache-reuse): runs of n+ tokens the KV cache holds later than a new prompt does
are moved to their place (llama.cpp shifts their positions) instead of decoded again, as when an editor's ring of
other files' chunks drops its oldest. A one-layer model's cache of a token depends on the token and its position
only, so there a moved run must give exactly what decoding the prompt afresh gives: the proof that the positions
were shifted, not merely relabelled."""

import pytest

import specllm
from helpers import check_kv

C1 = " chunk one is here and there" * 3
C2 = " chunk two sits at the end of the ring" * 3
C3 = " and a third one comes in last" * 3


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    from models.tiny import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("reuse") / "one-layer.gguf", seed=4, n_layer=1, name="one-layer")


def expected_reuse(cached, seq, n):
    """llama-server's scan: (tokens kept, tokens moved) for a cache holding `cached` and a prompt `seq`."""
    p = 0
    while p < min(len(cached), len(seq)) and cached[p] == seq[p]:
        p += 1
    c, moved = p, 0
    while c < len(cached) and p < len(seq):
        m = 0
        while c + m < len(cached) and p + m < len(seq) and cached[c + m] == seq[p + m]:
            m += 1
        if m >= n:
            moved += m if c != p else 0
            c, p = c + m, p + m
        else:
            c += 1
    return p, moved


def prompts(llm):
    tok = lambda s: llm.tokenize(s, add_special=False)  # noqa: E731
    head = llm.tokenize("the start of it all.")
    return head + tok(C1) + tok(C2) + tok(" tail one"), head + tok(C2) + tok(C3) + tok(" tail two")


def test_a_moved_run_gives_what_a_fresh_prompt_gives(one_layer, make_llm):
    llm = make_llm(one_layer)
    first, second = prompts(llm)
    llm.generate(first, max_tokens=8, cache_reuse=8)
    cached = list(llm._engine.target.cached)
    got = llm.generate(second, max_tokens=16, cache_reuse=8, logprobs=0)
    kept, moved = expected_reuse(cached, second[:-1], 8)
    assert (got.stats.n_cached, got.stats.n_shifted) == (kept, moved) and moved >= 60, got.stats
    check_kv(llm, second, got)
    with make_llm(one_layer) as fresh:
        want = fresh.generate(second, max_tokens=16, logprobs=0)
    assert got.tokens == want.tokens
    # the F16 cache is rounded again after the rotation: 0.004 here; a two-layer model's moved run reads 1.05 off
    assert max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, want.logprobs)) < 0.02


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_drafting_over_a_moved_cache_writes_plain_decodings_text(tiny, make_llm, draft):
    # a two-layer model: the moved run's cache is not what a fresh prompt computes, and the text may differ from a
    # fresh prompt's; speculative decoding over it writes what plain decoding over the same cache writes
    runs = {}
    for name, d in (("plain", None), ("spec", tiny["near_draft"] if draft == "model" else "ngram")):
        llm = make_llm(tiny["target"], d)
        first, second = prompts(llm)
        llm.generate(first, max_tokens=8, cache_reuse=8)
        opts = dict(max_tokens=24, cache_reuse=8) if d is None else dict(max_tokens=24, cache_reuse=8, draft_length=3)
        runs[name] = llm.generate(second, **opts)
        check_kv(llm, second, runs[name])
        assert runs[name].stats.n_shifted >= 60
    assert runs["spec"].tokens == runs["plain"].tokens and runs["spec"].stats.n_drafted > 0


def test_short_runs_and_no_reuse_keep_the_common_prefix_only(one_layer, make_llm):
    llm = make_llm(one_layer, prompt_cache_mb=0)  # no saved states: the second prompt comes back below
    first, second = prompts(llm)
    llm.generate(first, max_tokens=8)
    got = llm.generate(second, max_tokens=8)  # the default: off
    common, _ = expected_reuse(list(first), second, 10**6)
    assert got.stats.n_shifted == 0 and got.stats.n_cached == common
    llm.generate(first, max_tokens=8)
    got = llm.generate(second, max_tokens=8, cache_reuse=500)  # no run that long
    assert got.stats.n_shifted == 0 and got.stats.n_cached == common
    check_kv(llm, second, got)
    for bad, err in ((-1, specllm.InvalidOptionError), ("8", TypeError), (1.5, TypeError)):
        with pytest.raises(err, match="cache_reuse"):
            llm.generate(second, max_tokens=4, cache_reuse=bad)


def test_a_recurrent_model_decodes_again_instead(tiny, make_llm):
    llm = make_llm(tiny["recurrent"])
    first, second = prompts(llm)
    llm.generate(first, max_tokens=4, cache_reuse=8)
    got = llm.generate(second, max_tokens=4, cache_reuse=8)
    assert got.stats.n_shifted == 0
    with make_llm(tiny["recurrent"]) as fresh:
        assert fresh.generate(second, max_tokens=4).tokens == got.tokens


RUN_TWO = """
import sys, specllm
llm = specllm.LLM(sys.argv[1], None, n_threads=1, n_ctx=512, profile_costs=False, cache_type_k=sys.argv[2])
a = " chunk one is here and there" * 3
b = " chunk two sits at the end of the ring" * 3
c = " and a third one comes in last" * 3
llm.generate("the start." + a + b + " tail one", max_tokens=4, cache_reuse=8)
r = llm.generate("the start." + b + c + " tail two", max_tokens=4, cache_reuse=8)  # b's run would move back
print("MOVED", r.stats.n_shifted)
"""


@pytest.mark.parametrize("cache_type_k, moves", [("f16", True), ("bf16", False), ("q8_0", False), ("q4_0", False)])
def test_a_k_cache_llama_cpp_cannot_shift_keeps_the_prefix_instead_of_crashing(tiny_head32, cache_type_k, moves):
    """A reviewer's finding: moving a run with a bf16 K cache aborted the process in llama.cpp's rope, and with a
    quantized one whose head holds an odd number of blocks (32, 96 or 160 values) it segfaulted; a server died on one
    request's n_cache_reuse. Such a cache keeps the common prefix only (head 64 or 128: q8_0 moves runs)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", RUN_TWO, tiny_head32["target"], cache_type_k], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-1500:])
    moved = int(r.stdout.split("MOVED")[1])
    assert (moved > 0) == moves, r.stdout
