"""KV cache types (LLM(cache_type_k=..., cache_type_v=..., flash_attn=...), llama-server's -ctk/-ctv/-fa): the
target's and the draft model's caches take them, speculative greedy output stays plain decoding's with the same
cache, a prompt state on disk is read back only by an LLM with the same cache, and bad settings are typed errors."""
import pytest

import specllm
from helpers import check_kv, cli_env, run_cli

# (K, V, flash attention): quantized both, 4-bit, quantized K without flash attention, f16 without it
CACHES = [("q8_0", "q8_0", "auto"), ("q4_0", "q4_0", "on"), ("q8_0", "f16", "off"), ("f16", "f16", "off")]


@pytest.fixture(scope="module")
def head32(tiny_head32):
    return tiny_head32


def prompts():
    words = ["the", "cat", "sat", "on", "a", "mat", "x = 1", "def f():", "return"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(4 + 9 * i)) for i in range(5)]


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("k,v,fa", CACHES)
def test_speculative_greedy_output_is_plain_decodings_with_the_same_cache(head32, make_llm, k, v, fa, exact):
    kv = dict(cache_type_k=k, cache_type_v=v, flash_attn=fa, exact=exact)
    plain = make_llm(head32["target"], None, **kv)
    model = make_llm(head32["target"], head32["draft"], **kv)
    ngram = make_llm(head32["target"], "ngram", **kv)
    accepted = 0
    for p in prompts():
        want = plain.generate(p, max_tokens=48).tokens
        for llm in (model, ngram):
            got = llm.generate(p, max_tokens=48, draft_length=6)
            assert got.tokens == want, (k, v, fa, exact, p)
            accepted += got.stats.n_accepted
            check_kv(llm, llm.tokenize(p), got)
    assert accepted > 50  # the drafts were verified, accepted and cut back, not skipped


def test_the_cache_types_reach_target_and_draft(head32, make_llm):
    # a state's bytes per token: q8_0 stores 34 bytes per 32 values, f16 64, q4_0 18 (plus the tokens' bookkeeping)
    prompt = prompts()[-1]
    sizes = {}
    for k in ("f16", "q8_0", "q4_0"):
        llm = make_llm(head32["target"], head32["draft"], cache_type_k=k, cache_type_v=k)
        llm.generate(prompt, max_tokens=8, draft_length=4)
        t, d = llm._engine.target, llm._engine.draft
        assert t.n_past > 30 and d.n_past > 30
        sizes[k] = (t.state_size / t.n_past, d.state_size / d.n_past)  # bytes a token
    for i in (0, 1):  # target, then draft
        assert 0.45 < sizes["q8_0"][i] / sizes["f16"][i] < 0.6, sizes
        assert 0.22 < sizes["q4_0"][i] / sizes["f16"][i] < 0.35, sizes


def test_a_new_draft_model_takes_the_cache_types(head32, make_llm):
    llm = make_llm(head32["target"], None, cache_type_k="q8_0", cache_type_v="q8_0")
    llm.set_draft(head32["draft"], ngram=False)
    p = prompts()[-1]
    got = llm.generate(p, max_tokens=24, draft_length=4)
    f16 = make_llm(head32["target"], head32["draft"])
    f16.generate(p, max_tokens=24, draft_length=4)
    assert llm._engine.draft.state_size / llm._engine.draft.n_past < 0.6 * (f16._engine.draft.state_size /
                                                                            f16._engine.draft.n_past)
    assert got.tokens == make_llm(head32["target"], None, cache_type_k="q8_0",
                                  cache_type_v="q8_0").generate(p, max_tokens=24).tokens


def test_prompt_states_on_disk_are_read_back_by_the_same_cache_only(head32, make_llm, tmp_path):
    prompt = " ".join(prompts())  # ~380 tokens: a state is kept from 64
    q8 = dict(cache_type_k="q8_0", cache_type_v="q8_0", prompt_cache_dir=tmp_path)
    with make_llm(head32["target"], "ngram", **q8) as first:
        one = first.generate(prompt, max_tokens=8)
    assert len(list(tmp_path.glob("*.kv"))) == 1
    again = make_llm(head32["target"], "ngram", **q8).generate(prompt, max_tokens=8)
    assert again.stats.restored_from_disk and again.tokens == one.tokens
    # the f16 LLM sees no state of its own there (a q8_0 state would not fit its cache): it decodes the prompt
    with make_llm(head32["target"], "ngram", prompt_cache_dir=tmp_path) as f16:
        other = f16.generate(prompt, max_tokens=8)
    assert not other.stats.restored_from_disk and other.stats.n_cached == 0
    assert len(list(tmp_path.glob("*.kv"))) == 2  # and writes its own beside it (one would do for one cache)
    for kv in (q8, dict(prompt_cache_dir=tmp_path)):
        assert make_llm(head32["target"], "ngram", **kv).generate(prompt, max_tokens=8).stats.restored_from_disk


def test_a_profile_is_kept_per_cache_type(head32):
    from specllm import _core, amx, profile_files

    o = _core.ModelOptions()
    o.repack = True
    # the defaults' profiles keep the keys they had before cache types (another where AMX is left out: specllm/amx.py)
    assert profile_files.kernel_key(o) == ("True|amx=off" if amx.left_out() else True)
    keys = set()
    for k, v, fa in CACHES + [("f16", "f16", -1)]:
        o.cache_type_k, o.cache_type_v, o.flash_attn = k, v, {"auto": -1, "off": 0, "on": 1}.get(fa, fa)
        keys.add(profile_files.key(head32["target"], "", 1, 0, profile_files.kernel_key(o), 0))
    assert len(keys) == len(CACHES) + 1


@pytest.mark.parametrize("kw,error,words", [
    (dict(cache_type_k="q9"), specllm.InvalidOptionError, "cache_type_k must be one of f16"),
    (dict(cache_type_v="Q8_0"), specllm.InvalidOptionError, "cache_type_v must be one of"),
    (dict(cache_type_k=8), TypeError, "cache_type_k must be a str"),
    (dict(flash_attn="yes"), specllm.InvalidOptionError, "flash_attn must be 'auto', 'on' or 'off'"),
    (dict(flash_attn=1), specllm.InvalidOptionError, "flash_attn must be"),
    (dict(cache_type_v="q4_0", flash_attn="off"), specllm.InvalidOptionError, "needs flash attention"),
    (dict(cache_type_v="q4_0", flash_attn=False), specllm.InvalidOptionError, "needs flash attention"),
])
def test_bad_settings_are_typed_errors_before_loading(tiny, make_llm, kw, error, words):
    with pytest.raises(error, match=words):
        make_llm(tiny["target"], None, **kw)


def test_a_quantized_cache_the_heads_do_not_fit_is_a_load_error_naming_them(tiny, head32, make_llm):
    # the standard tiny target's heads hold 16 values, less than a q8_0 block of 32
    for fa in ("auto", "off"):  # off: llama.cpp asserted (the process aborted); checked before it now
        with pytest.raises(specllm.ModelLoadError) as e:
            make_llm(tiny["target"], None, cache_type_k="q8_0", flash_attn=fa)
        assert "cache_type_k=q8_0 stores blocks of 32 values, which do not divide" in str(e.value)
        assert "attention head size (16) of" in str(e.value) and "use f16" in str(e.value)
    # a draft model whose heads do not fit (8 values) fails the load the same way, naming the draft
    with pytest.raises(specllm.ModelLoadError, match="draft.gguf"):
        make_llm(head32["target"], tiny["draft"], cache_type_k="q8_0", cache_type_v="q8_0")
    llm = make_llm(head32["target"], None, cache_type_k="q8_0", cache_type_v="q8_0")
    with pytest.raises(specllm.ModelLoadError, match="divide"):  # a swap to it leaves the old drafter in place
        llm.set_draft(tiny["draft"], ngram=False)
    assert llm.draft is None and len(llm.generate("the cat", max_tokens=4).tokens) == 4


# --- specllm-cli and serve: llama-server's flags

cli = run_cli


@pytest.fixture
def env(tmp_path):
    return cli_env(tmp_path)


def test_specllm_cli_takes_llama_servers_cache_flags(head32, tiny, make_llm, env):
    m = head32
    r = cli(env, "generate", "the cat sat", "--raw", "--max-tokens", "24", "--model", m["target"], "--draft",
            m["draft"], "--threads", "1", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on")
    assert r.returncode == 0, r.stderr
    want = make_llm(m["target"], None, cache_type_k="q8_0", cache_type_v="q8_0")
    assert r.stdout == want.generate("the cat sat", max_tokens=24).text
    for flags, words in ((["--model", tiny["target"], "--cache-type-k", "q8_0"], "do not divide the attention head size (16)"),
                         (["--model", m["target"], "-ctv", "q4_0", "--flash-attn", "off"], "needs flash attention")):
        r = cli(env, "generate", "x", "--raw", "--draft", "none", *flags)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], r.stderr
    r = cli(env, "generate", "x", "--model", m["target"], "-ctk", "q3_k")
    assert r.returncode == 2 and "argument --cache-type-k/-ctk: invalid choice: 'q3_k'" in r.stderr


def test_serve_with_a_quantized_cache_answers_as_the_library_does(head32, make_llm, tmp_path):
    import openai

    from serving import Server

    m = head32
    s = Server("--model", m["target"], "--draft", m["draft"], "--threads", "1", "--ctx", "1024", "-ctk", "q8_0",
               "-ctv", "q8_0", log_path=tmp_path / "log")
    try:
        s.wait_healthy()
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "the cat sat on"}]
        got = client.chat.completions.create(model="target", messages=messages, max_tokens=24, temperature=0)
        want = make_llm(m["target"], None, cache_type_k="q8_0", cache_type_v="q8_0").chat(messages, max_tokens=24)
        assert got.choices[0].message.content == want.text
    finally:
        assert s.stop() == 0, s.log()
    bad = Server("--model", m["target"], "--draft", "none", "-ctv", "q8_0", "-fa", "off", log_path=tmp_path / "log2")
    assert bad.proc.wait(60) == 1
    assert "needs flash attention" in bad.log() and "Traceback" not in bad.log()


def test_a_k_cache_below_8_bits_is_warned_about(head32, make_llm, caplog):
    with caplog.at_level("WARNING", logger="specllm"):
        make_llm(head32["target"], None, cache_type_k="q8_0", cache_type_v="q4_0")
        assert "below 8 bits" not in caplog.text
        make_llm(head32["target"], None, cache_type_k="q5_1", cache_type_v="q8_0")
    assert "a K cache of q5_1 (below 8 bits)" in caplog.text
