"""Fill in the middle: generate(prefix, suffix=...) and the server's /v1/completions `suffix` build the model's FIM
prompt (<FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>) from its own special tokens, cut to fit beside max_tokens,
and draft and verify it like any prompt. Tiny models with Qwen2.5-Coder's FIM tokens (models/tiny.py "byte-fim")."""

import signal

import openai
import pytest

import specllm
from helpers import check_kv, write_perturbed_copy
from serving import Server

PREFIX = "def add(a, b):\n    the cat "
SUFFIX = "\n\nprint(add(1, 2))  # the cat sat on the mat\n"


@pytest.fixture(scope="module")
def fim(tmp_path_factory):
    from models.tiny import write_tiny_model

    d = tmp_path_factory.mktemp("fim")
    target = write_tiny_model(d / "fim.gguf", seed=0, vocab="byte-fim", name="tiny-fim")
    return {"target": target, "near_draft": write_perturbed_copy(target, d / "fim-near.gguf", noise=0.3, seed=1)}


def test_the_prompt_is_the_models_fim_form_with_special_text_kept_as_text(fim, make_llm):
    llm = make_llm(fim["target"])
    ids = llm._engine.target.fim_tokens
    assert sorted(ids.values()) == [3, 4, 5]  # found by their text, as Qwen2.5-Coder's are
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
    with pytest.raises(specllm.InvalidOptionError, match="no room"):
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
    assert llm.generate("def f():", suffix="\n", max_tokens=4).stats.n_generated >= 1  # still usable


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
        for kw, param in ((dict(prompt=[1, 2, 3], suffix="x"), "prompt"),
                          (dict(prompt="a", suffix="b", max_tokens=2047), "suffix")):
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(model="fim", **{"max_tokens": 8, **kw})
            assert e.value.body["param"] == param, e.value.body
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
