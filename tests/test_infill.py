"""Fill in the middle: generate(prefix, suffix=...) and the server's /v1/completions `suffix` build the model's FIM
prompt (<FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>) from its own special tokens, cut to fit beside max_tokens,
and draft and verify it like any prompt. Tiny models with Qwen2.5-Coder's FIM tokens (models/tiny.py "byte-fim")."""

import signal

import openai
import pytest

import specllm
from helpers import check_kv, write_perturbed_copy
from serving import Server, data_events, post_json
from specllm.server.native import Limits

PREFIX = "def add(a, b):\n    the cat "
SUFFIX = "\n\nprint(add(1, 2))  # the cat sat on the mat\n"


@pytest.fixture(scope="module")
def fim(tmp_path_factory):
    from models.tiny import write_tiny_model

    d = tmp_path_factory.mktemp("fim")
    target = write_tiny_model(d / "fim.gguf", seed=0, vocab="byte-fim", name="tiny-fim")
    repo = write_tiny_model(d / "repo.gguf", seed=0, vocab="byte-repo", name="tiny-repo")
    return {"target": target, "near_draft": write_perturbed_copy(target, d / "fim-near.gguf", noise=0.3, seed=1),
            "repo": repo}


def test_the_prompt_is_the_models_fim_form_with_special_text_kept_as_text(fim, make_llm):
    llm = make_llm(fim["target"])
    ids = llm._engine.target.fim_tokens
    assert ids == {"pre": 3, "suf": 4, "mid": 5, "rep": -1, "sep": -1}  # found by their text, as Qwen2.5-Coder's are
    prefix = PREFIX + "<|fim_middle|>"  # text in a file, not the token
    tokens = llm.infill_prompt(prefix, SUFFIX, max_tokens=16)
    t = llm._engine.target
    assert tokens == (t.tokenize("", True, False) + [ids["pre"]] + t.tokenize(prefix, False, False) + [ids["suf"]] +
                      t.tokenize(SUFFIX, False, False) + [ids["mid"]])
    assert tokens.count(ids["mid"]) == 1


def test_what_does_not_fit_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix(fim, make_llm):
    llm = make_llm(fim["target"], n_ctx=256)
    t, ids = llm._engine.target, llm._engine.target.fim_tokens
    prefix, suffix = "".join(f"line {i}\n" for i in range(200)), "".join(f"after {i}\n" for i in range(200))
    tokens = llm.infill_prompt(prefix, suffix, max_tokens=56)
    assert len(tokens) == 256 - 56
    pre = tokens[tokens.index(ids["pre"]) + 1:tokens.index(ids["suf"])]
    suf = tokens[tokens.index(ids["suf"]) + 1:tokens.index(ids["mid"])]
    assert pre == t.tokenize(prefix, False, False)[-len(pre):] and suf == t.tokenize(suffix, False, False)[:len(suf)]
    assert len(suf) == (200 - 4) // 4  # both long: a quarter of the room to the suffix
    short = llm.infill_prompt(prefix, "x = 1\n", max_tokens=56)  # a short suffix is kept whole
    assert short[short.index(ids["suf"]) + 1:short.index(ids["mid"])] == t.tokenize("x = 1\n", False, False)
    assert len(short) == 200
    whole = llm.infill_prompt("a = 1\n", "b = 2\n", max_tokens=56)  # both fit: nothing cut
    assert len(whole) == (len(t.tokenize("", True, False)) + 3 + len(t.tokenize("a = 1\n", False, False)) +
                          len(t.tokenize("b = 2\n", False, False)))
    with pytest.raises(specllm.ContextOverflowError, match="no room"):
        llm.infill_prompt(prefix, suffix, max_tokens=254)


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_generate_with_a_suffix_fills_the_middle_and_drafts_like_any_prompt(fim, make_llm, draft):
    plain = make_llm(fim["target"])
    want = plain.generate(plain.infill_prompt(PREFIX, SUFFIX, max_tokens=40), max_tokens=40)
    llm = make_llm(fim["target"], fim["near_draft"] if draft == "model" else draft)
    opts = dict(max_tokens=40) if draft is None else dict(max_tokens=40, draft_length=4)
    got = llm.generate(PREFIX, suffix=SUFFIX, **opts)
    assert got.tokens == want.tokens and got.stats.n_prompt == len(plain.infill_prompt(PREFIX, SUFFIX, 40))
    if draft is not None:
        assert got.stats.n_drafted > 0
    check_kv(llm, llm.infill_prompt(PREFIX, SUFFIX, max_tokens=40), got)
    streamed = "".join(c.text for c in llm.stream(PREFIX, suffix=SUFFIX, **opts))
    assert streamed == got.text


def test_specllm_generate_passes_suffix_to_the_generation(fim, make_llm):
    """specllm.generate splits its keywords between LLM(...) and LLM.generate: suffix went to LLM(...) (TypeError)."""
    import inspect

    from specllm.options import GENERATE_KEYS, make_options

    plain = make_llm(fim["target"])
    want = plain.generate(PREFIX, suffix=SUFFIX, max_tokens=12)
    got = specllm.generate(PREFIX, model=str(fim["target"]), draft=None, suffix=SUFFIX, max_tokens=12, n_threads=1,
                           n_ctx=512, profile_costs=False)
    assert got.tokens == want.tokens
    assert set(inspect.signature(make_options).parameters) | {"suffix"} <= GENERATE_KEYS  # every generate keyword


def test_bad_input(fim, tiny, make_llm):
    with pytest.raises(specllm.InvalidOptionError, match="suffix .*FIM tokens"):
        make_llm(tiny["target"]).generate("def f():", suffix="\n", max_tokens=4)  # no FIM tokens
    llm = make_llm(fim["target"])
    with pytest.raises(TypeError, match="suffix"):
        llm.generate("def f():", suffix=5)
    with pytest.raises(TypeError, match="prompt"):
        llm.generate([1, 2, 3], suffix="\n")  # the prefix is text
    with pytest.raises(TypeError, match="max_tokens"):
        llm.infill_prompt("a", "b", max_tokens="16")
    with pytest.raises(specllm.InvalidOptionError, match="max_tokens"):
        llm.infill_prompt("a", "b", max_tokens=-1)
    for extra, word in (("abc", "extra must be a list"), ([("a.py",)], r"extra\[0\] must be a \(filename, text\)"),
                        ([("a.py", "x", "y")], r"extra\[0\]"), ([("a.py", 5)], r"extra\[0\] text")):
        with pytest.raises(TypeError, match=word):
            llm.infill_prompt("a", "b", extra=extra)
    with pytest.raises(specllm.ContextOverflowError, match="middle's start"):
        llm.infill_prompt("a", "b", max_tokens=8, middle="x " * (llm.n_ctx + 10))
    with pytest.raises(TypeError, match="suffix"):  # chat's prompt is a conversation: no fill in the middle
        make_llm(fim["target"]).chat([{"role": "user", "content": "x"}], max_tokens=1, suffix="END")
    assert llm.generate("def f():", suffix="\n", max_tokens=4).stats.n_generated >= 1  # still usable


def test_max_tokens_0_scores_a_fim_prompt(fim, make_llm):
    """max_tokens=0 processes the prompt only, with a suffix too (it was refused: 'max_tokens must be >= 1')."""
    llm = make_llm(fim["target"])
    done = llm.generate(PREFIX, suffix=SUFFIX, max_tokens=0)
    assert done.tokens == [] and done.stats.n_prompt == len(llm.infill_prompt(PREFIX, SUFFIX, max_tokens=0))


def test_the_server_fills_the_middle_from_completions_suffix(fim, tiny, make_llm, tmp_path):
    local = make_llm(fim["target"], n_ctx=2048)
    want = local.generate(PREFIX, suffix=SUFFIX, max_tokens=24)
    s = Server("--model", fim["target"], "--draft", "ngram", "--threads", "1", "--ctx", "2048",
               log_path=tmp_path / "fim.log").wait_healthy()
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=60)
        r = client.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=24, temperature=0)
        assert r.choices[0].text == want.text and r.usage.prompt_tokens == want.stats.n_prompt
        chunks = client.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=24, temperature=0,
                                           stream=True)
        assert "".join(c.choices[0].text for c in chunks) == want.text
        for kw, param, code in ((dict(prompt=[1, 2, 3], suffix="x"), "prompt", "invalid_value"),
                                (dict(prompt="a", suffix="b", max_tokens=2047), "max_tokens",
                                 "context_length_exceeded")):
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(model="fim", **{"max_tokens": 8, **kw})
            assert e.value.body["param"] == param and e.value.body["code"] == code, e.value.body
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()
    plain = Server("--model", tiny["target"], "--draft", "none", "--threads", "1", "--ctx", "512",
                   log_path=tmp_path / "plain.log").wait_healthy()
    try:
        client = openai.OpenAI(base_url=f"{plain.url}/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as e:  # a model without FIM tokens
            client.completions.create(model="target", prompt=PREFIX, suffix=SUFFIX, max_tokens=8)
        assert e.value.body["param"] == "suffix" and "FIM tokens" in e.value.body["message"]
    finally:
        assert plain.stop(signal.SIGINT) == 0, plain.log()


EXTRA = [("util.py", "def sub(a, b):\n    return a - b\n"), ("main.py", "print(sub(3, 1))\n")]


def test_other_files_go_before_the_prefix_in_the_repo_level_form(fim, make_llm):
    # llama-server's /infill layout: <REP>myproject\n, each chunk as <SEP>name\n text, <SEP>filename\n, then the
    # FIM prompt and the text the middle starts with
    llm = make_llm(fim["repo"])
    t, ids = llm._engine.target, llm._engine.target.fim_tokens
    assert ids == {"pre": 3, "suf": 4, "mid": 5, "rep": 6, "sep": 7}
    tok = lambda s: t.tokenize(s, False, False)  # noqa: E731
    got = llm.infill_prompt(PREFIX, SUFFIX, 16, extra=EXTRA, middle="ret")
    head = [6] + tok("myproject\n") + [7] + tok("util.py\n") + tok(EXTRA[0][1]) + [7] + tok("main.py\n") + \
        tok(EXTRA[1][1]) + [7] + tok("filename\n")
    assert got == t.tokenize("", True, False) + head + [3] + tok(PREFIX) + [4] + tok(SUFFIX) + [5] + tok("ret")
    bos = t.tokenize("", True, False)
    empty = llm.infill_prompt(PREFIX, SUFFIX, 16, extra=[])  # no chunks: the repo header and the file's line still
    assert empty[:len(bos) + 2 + len(tok("myproject\n")) + len(tok("filename\n"))] == \
        bos + [6] + tok("myproject\n") + [7] + tok("filename\n")
    # what does not fit keeps the prefix and suffix whole and the end of the extra text (the chunks last sent)
    room = len(got) + 10
    small = make_llm(fim["repo"], n_ctx=256)
    old = "".join(f"old {i}\n" for i in range(100))
    cut = small.infill_prompt(PREFIX, SUFFIX, small.n_ctx - room, extra=[("old.py", old)] + EXTRA, middle="ret")
    n_rep = 1 + len(tok("myproject\n"))  # the header's tokens: the room's 10 and these come from old.py's end
    assert len(cut) == room and cut[len(bos) + n_rep + 10:] == got[len(bos) + n_rep:]
    assert cut[len(bos):len(bos) + n_rep + 10] == tok(old)[-(n_rep + 10):]
    # a model without the repo tokens: each chunk after a snippet line, as llama-server writes it
    plain = make_llm(fim["target"])
    tp = plain._engine.target
    got = plain.infill_prompt(PREFIX, SUFFIX, 16, extra=EXTRA[:1])
    assert got[:-len(plain.infill_prompt(PREFIX, SUFFIX, 16)) + 1] == tp.tokenize("", True, False) + \
        tp.tokenize("\n\n--- snippet ---\n\n", False, False) + tp.tokenize(EXTRA[0][1], False, False)
    with pytest.raises(TypeError, match=r"extra\[0\] text"):
        llm.infill_prompt(PREFIX, SUFFIX, 16, extra=[("a.py", 5)])


def test_llama_servers_limits_on_the_middle():
    from specllm.server.native import Limits

    # n_indent: the first line after the first indented less ends the middle, cut where its text starts; a line's
    # indentation is held back until its text shows which it is, so what was passed on stands
    text = "x = 1\n    y = 2\n\n  z = 3\n"
    for pieces in ([text], list(text), ["x = 1\n  ", "  y = 2\n", "\n  z", " = 3\n"]):
        lim = Limits(4, 0)
        out = "".join(lim.feed(p) for p in pieces)
        assert lim.stopped and out == "x = 1\n    y = 2\n" and lim.rest() == ""
    lim = Limits(2, 0)
    out = lim.feed("a\n  b\n ")  # the last line's text has not come
    assert out == "a\n  b\n" and not lim.stopped and lim.rest() == " "
    assert Limits(0, 0).feed(text) == text
    # t_max_predict_ms: at a newline once generating has taken that long
    now = [0.0]
    lim = Limits(0, 100, clock=lambda: now[0])
    assert lim.feed("def f(") == "def f("
    now[0] = 0.5
    assert lim.feed("):") == "):" and not lim.stopped  # no newline yet
    assert lim.feed("\n    return 1") == "\n    return 1" and lim.stopped
    assert lim.feed("more") == ""


def _infill(url, **body):
    return post_json(url, "/infill", **body)


def _infill_stream(url, **body):
    return data_events(url, "/infill", **body)


def test_the_servers_infill_endpoint_answers_as_llama_server(fim, make_llm, tmp_path):
    # an editor plugin's request (llama.vscode, llama.vim): other files' chunks, the text the middle starts with,
    # llama-server's sampling fields and limits; the answer in llama-server's form
    local = make_llm(fim["repo"], "ngram", n_ctx=2048)
    prompt = local.infill_prompt(PREFIX, SUFFIX, 24, extra=EXTRA, middle="ret")
    want = local.generate(prompt, max_tokens=24, temperature=0)
    sampled = local.generate(prompt, max_tokens=24, temperature=1.0, top_k=40, top_p=0.99, min_p=0.0, seed=5)
    s = Server("--model", fim["repo"], "--draft", "ngram", "--threads", "1", "--ctx", "2048",
               log_path=tmp_path / "infill.log").wait_healthy()
    request = dict(input_prefix=PREFIX, input_suffix=SUFFIX, prompt="ret", n_predict=24,
                   input_extra=[{"filename": f, "text": t} for f, t in EXTRA])
    try:
        status, warm = _infill(s.url, **dict(request, n_predict=0, t_max_predict_ms=1, cache_prompt=True))
        assert status == 200 and warm["content"] == "" and warm["timings"]["prompt_n"] == len(prompt), warm
        status, r = _infill(s.url, **request, temperature=0, cache_prompt=True, t_max_prompt_ms=500)
        assert status == 200, r
        assert r["content"] == want.text and r["stop"] is True and r["tokens_predicted"] == want.stats.n_generated
        assert r["tokens_evaluated"] == len(prompt) and r["timings"]["cache_n"] >= len(prompt) - 1  # warmed
        assert r["stop_type"] == ("limit" if want.finish_reason == "length" else "eos")
        assert r["timings"]["predicted_n"] == want.stats.n_generated and r["timings"]["predicted_per_second"] > 0
        events = _infill_stream(s.url, **request, temperature=0)
        assert "".join(e["content"] for e in events) == want.text
        assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
        assert events[-1]["timings"]["predicted_n"] == want.stats.n_generated
        # llama.vscode's samplers: top_k and top_p applied, temperature not (llama.cpp then samples at 1)
        status, r = _infill(s.url, **request, samplers=["top_k", "top_p", "infill"], top_k=40, top_p=0.99, seed=5)
        assert status == 200 and r["content"] == sampled.text, (r, sampled.text)
        assert r["generation_settings"]["temperature"] == 1.0 and r["generation_settings"]["min_p"] == 0.0
        # llama-server's repetition penalties, as in-process generation applies them
        penalized = local.generate(prompt, max_tokens=24, temperature=0, repeat_penalty=1.5, penalty_last_n=16,
                                   presence_penalty=0.5)
        status, r = _infill(s.url, **request, temperature=0, repeat_penalty=1.5, repeat_last_n=16, presence_penalty=0.5)
        assert status == 200 and r["content"] == penalized.text != want.text, (r, penalized.text)
        # n_indent: the middle ends at the first later line indented less, as llama-server cuts it
        lim = Limits(2, 0)
        cut = lim.feed(want.text) + ("" if lim.stopped else lim.rest())
        status, r = _infill(s.url, **request, temperature=0, n_indent=2)
        assert status == 200 and r["content"] == cut and (r["stop_type"] == "limit") == (lim.stopped or
                                                                                         want.finish_reason == "length")
        events = _infill_stream(s.url, **request, temperature=0, n_indent=2)
        assert "".join(e["content"] for e in events) == cut
        for body, param in ((dict(samplers=["top_k", "mirostat_v3"]), "samplers"), (dict(lora=[{"id": 0}]), "lora"),
                            (dict(n_probs=99), "n_probs"), (dict(input_extra={"a": 1}), "input_extra"),
                            (dict(input_extra=[{"filename": "a.py"}]), "input_extra"), (dict(n_predict=-2), "n_predict"),
                            (dict(input_suffix=None), "input_suffix"), (dict(n_predict=2048), "n_predict"),
                            (dict(n_predict=-1, prompt="ret " * 2100), "prompt"),
                            (dict(top_p=0), "top_p"), (dict(seed="x"), "seed"),
                            (dict(input_prefix="a\ud800"), "input_prefix"), (dict(prompt="x\udc00"), "prompt")):
            status, r = _infill(s.url, **dict(request, **body))
            assert status == 400 and r["error"]["param"].split(".")[0] == param, (body, r)
            overflow = body.get("n_predict") == 2048 or "ret ret" in str(body.get("prompt"))
            assert (r["error"]["code"] == "context_length_exceeded") == overflow, (body, r)
        status, r = _infill(s.url, **request, model="another")
        assert status == 404, r
        status, r = _infill(s.url, **request, temperature=0)  # still serving
        assert status == 200 and r["content"] == want.text
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


def test_infill_needs_a_model_with_fim_tokens(tiny, tmp_path):
    s = Server("--model", tiny["target"], "--draft", "none", "--threads", "1", "--ctx", "512",
               log_path=tmp_path / "plain.log").wait_healthy()
    try:
        status, r = _infill(s.url, input_prefix="def f():", input_suffix="\n", n_predict=4)
        assert status == 400 and r["error"]["param"] == "input_suffix" and "FIM tokens" in r["error"]["message"]
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


def test_the_servers_cache_reuse_moves_a_chunk_the_ring_kept(fim, tmp_path):
    # --cache-reuse (llama-server's): when an editor's ring of chunks drops its oldest, the chunk that stays is
    # moved in the cache instead of decoded again; a request's n_cache_reuse overrides it
    a, b, c = (("a.py", "".join(f"alpha {i} = {i}\n" for i in range(20))),
               ("b.py", "".join(f"beta {i} = {i * 2}\n" for i in range(20))),
               ("c.py", "".join(f"gamma {i} = {i * 3}\n" for i in range(20))))
    chunks = lambda *fs: [{"filename": f, "text": t} for f, t in fs]  # noqa: E731
    s = Server("--model", fim["repo"], "--draft", "ngram", "--threads", "1", "--ctx", "2048", "--cache-reuse", "8",
               "--prompt-cache-mb", "0", log_path=tmp_path / "reuse.log").wait_healthy()
    request = dict(input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=8, temperature=0)
    try:
        got = {}
        for reuse in (None, 0):
            status, warm = _infill(s.url, **dict(request, input_extra=chunks(a, b), n_predict=0))
            assert status == 200, warm
            extra = {} if reuse is None else {"n_cache_reuse": reuse}
            status, r = _infill(s.url, **request, **extra, input_extra=chunks(b, c))
            assert status == 200, r
            got[reuse] = r
        n_b = got[0]["tokens_evaluated"] - got[0]["timings"]["cache_n"]  # without reuse: all but the repo header
        assert got[None]["timings"]["cache_n"] >= got[0]["timings"]["cache_n"] + 150, got  # b.py: ~200 tokens
        assert got[None]["timings"]["prompt_n"] < n_b - 150
        import httpx

        # the OpenAI endpoints: the same flag, and the same override. Token prompts: a run is moved only if it
        # starts right where the prompt leaves the cache, and text tokenizes differently at a file's start
        local = specllm.LLM(fim["repo"], draft=None, n_threads=1, profile_costs=False)
        bos, (ta, tb, tc) = local.tokenize(""), (local.tokenize(f[1], add_special=False) for f in (a, b, c))
        local.close()
        cached = {}
        for reuse in (None, 0):
            for prompt in (bos + ta + tb + [10], bos + tb + tc + [11]):
                body = dict(prompt=prompt, max_tokens=4, temperature=0, **({} if reuse is None else
                                                                         {"n_cache_reuse": reuse}))
                r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60)
                assert r.status_code == 200, r.text
            cached[reuse] = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached[None] >= cached[0] + 150, cached
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()
