"""POST /completion (and /completions): llama-server's native text completion, answered in its form and checked
against in-process generation of the same prompt (greedy, sampled with llama-server's defaults and a seed, streamed,
under a grammar or a JSON schema), its prompt forms (text, token ids, mixed), and the bad requests; and its
/tokenize, /detokenize and /props."""

import json
import signal

import httpx
import pytest

from serving import Server, data_events, post_json

PROMPT = "the cat sat on the mat and the cat "
GRAMMAR = 'root ::= word (" " word){3}\nword ::= "the" | "in" | "an"'
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    s = Server("--model", tiny["target"], "--draft", "ngram", "--threads", "1", "--ctx", "512", "--exact",
               log_path=tmp_path_factory.mktemp("completion") / "server.log").wait_healthy()
    yield s
    assert s.stop(signal.SIGINT) == 0, s.log()


@pytest.fixture(scope="module")
def local(tiny, make_llm):
    return make_llm(tiny["target"])


def post(url, path="/completion", **body):
    return post_json(url, path, **body)


def stream(url, **body):
    return data_events(url, "/completion", **body)


def test_a_text_prompt_is_completed_as_in_process_generation(server, local):
    want = local.generate(PROMPT, max_tokens=24)
    status, r = post(server.url, prompt=PROMPT, n_predict=24, temperature=0, return_tokens=True, cache_prompt=True)
    assert status == 200, r
    assert r["content"] == want.text and r["tokens"] == want.tokens and r["stop"] is True
    assert r["tokens_predicted"] == want.stats.n_generated and r["tokens_evaluated"] == len(local.prompt_tokens(PROMPT))
    assert r["prompt"] == local.detokenize(local.prompt_tokens(PROMPT), special=True) and PROMPT in r["prompt"]
    assert r["stop_type"] == ("limit" if want.finish_reason == "length" else "eos")
    assert r["timings"]["predicted_n"] == want.stats.n_generated and r["speculative"]["drafted_tokens"] >= 0
    # the same prompt as token ids, as a one-prompt list, and mixed (text, then ids), through /completions too
    ids = local.prompt_tokens(PROMPT)
    head, tail = "the cat sat on the mat", local.tokenize(" and the cat ", False)
    for prompt, path in ((ids, "/completion"), ([PROMPT], "/completions"), ([ids], "/completion")):
        status, r = post(server.url, path, prompt=prompt, n_predict=24, temperature=0)
        assert status == 200 and r["content"] == want.text, (prompt, r)
    mixed = local.prompt_tokens(head) + tail
    status, r = post(server.url, prompt=[head] + tail, n_predict=24, temperature=0, return_tokens=True)
    assert status == 200 and r["tokens"] == local.generate(mixed, max_tokens=24).tokens
    assert r["tokens_evaluated"] == len(mixed) and r["timings"]["cache_n"] > 0  # the earlier prompts' prefix


def test_several_prompts_are_answered_in_order_as_a_list_as_llama_server(server, local):
    # llama-server's forms of several prompts: texts, token lists, mixed lists; one answer each, in order, with its
    # index and prompt (a single prompt's answer is an object, as before)
    texts = [PROMPT, "in the mat the ", "an the in "]
    want = [local.generate(t, max_tokens=12) for t in texts]
    ids = [local.prompt_tokens(t) for t in texts]
    mixed = ["an the", *local.tokenize(" mat ", False)]  # a mixed list is one prompt
    mixed_ids = local.prompt_tokens("an the") + mixed[1:]
    for prompt in (texts, ids, [texts[0], ids[1], mixed]):
        if prompt[2] is mixed:
            want[2], ids[2] = local.generate(mixed_ids, max_tokens=12), mixed_ids
        status, r = post(server.url, prompt=prompt, n_predict=12, temperature=0, return_tokens=True)
        assert status == 200 and isinstance(r, list) and len(r) == 3, r
        assert [a["index"] for a in r] == [0, 1, 2]
        assert [a["content"] for a in r] == [w.text for w in want]
        assert [a["tokens"] for a in r] == [w.tokens for w in want]
        assert [a["prompt"] for a in r] == [local.detokenize(i, special=True) for i in ids]
        assert [a["tokens_evaluated"] for a in r] == [len(i) for i in ids]
    # streamed: each prompt's events in turn, each carrying its index, each prompt ending with its "stop" event
    events = stream(server.url, prompt=texts[:2], n_predict=12, temperature=0)
    for i in range(2):
        mine = [e for e in events if e["index"] == i]
        assert "".join(e["content"] for e in mine) == want[i].text
        assert [e["stop"] for e in mine] == [False] * (len(mine) - 1) + [True]
        assert mine[-1]["prompt"] == local.detokenize(ids[i], special=True)
    assert [e["index"] for e in events] == sorted(e["index"] for e in events)  # one after another
    # sampled with a seed: each prompt as a request of its own with that seed
    status, r = post(server.url, prompt=texts[:2], n_predict=12, seed=7)
    singles = [post(server.url, prompt=t, n_predict=12, seed=7)[1]["content"] for t in texts[:2]]
    assert status == 200 and [a["content"] for a in r] == singles


def test_sampling_follows_llama_servers_defaults_and_the_seed(server, local):
    # llama.cpp's chain: top_k, top_p and min_p on the unscaled distribution, the temperature last (specllm's own
    # order, temperature first, read min_p 0.05 as ~0.09 of the raw distribution: another text for the seed)
    want = local.generate(PROMPT, max_tokens=24, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7,
                          temperature_last=True)
    first = local.generate(PROMPT, max_tokens=24, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    assert first.text != want.text  # the seed tells the orders apart
    status, r = post(server.url, prompt=PROMPT, n_predict=24, seed=7)
    assert status == 200 and r["content"] == want.text
    assert r["generation_settings"]["temperature"] == 0.8 and r["generation_settings"]["top_k"] == 40
    status, r = post(server.url, prompt=PROMPT, n_predict=24, seed=7, samplers=["temperature", "top_k", "top_p",
                                                                                 "min_p"])
    assert status == 200 and r["content"] == first.text  # a samplers list with the temperature first: that order
    status, r = post(server.url, prompt=PROMPT, n_predict=4, samplers=["top_k", "temperature", "min_p"])
    assert status == 400 and r["error"]["param"] == "samplers"
    other = local.generate(PROMPT, max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    status, r = post(server.url, prompt=PROMPT, n_predict=24, seed=3, temperature=1.0, top_k=0, top_p=1.0, min_p=0)
    assert status == 200 and r["content"] == other.text and other.text != want.text


def test_repetition_penalties_as_in_process_generation(server, local):
    # llama-server's repeat_penalty / repeat_last_n / frequency_penalty / presence_penalty, and OpenAI's two on
    # /v1/completions; a samplers list without "penalties" leaves them out, as llama.cpp's chain does
    free = local.generate(PROMPT, max_tokens=24)
    want = local.generate(PROMPT, max_tokens=24, repeat_penalty=1.5, penalty_last_n=16, frequency_penalty=0.3)
    assert want.text != free.text
    status, r = post(server.url, prompt=PROMPT, n_predict=24, temperature=0, repeat_penalty=1.5, repeat_last_n=16,
                     frequency_penalty=0.3)
    assert status == 200 and r["content"] == want.text, r
    status, r = post(server.url, prompt=PROMPT, n_predict=24, temperature=0, repeat_penalty=1.5, repeat_last_n=16,
                     frequency_penalty=0.3, samplers=["top_k", "temperature"])
    assert status == 200 and r["content"] == free.text, r
    want = local.generate(PROMPT, max_tokens=24, frequency_penalty=1.0, presence_penalty=0.5)
    status, r = post(server.url, "/v1/completions", prompt=PROMPT, max_tokens=24, temperature=0,
                     frequency_penalty=1.0, presence_penalty=0.5)
    assert status == 200 and r["choices"][0]["text"] == want.text and want.text != free.text, r
    status, r = post(server.url, "/v1/completions", prompt=PROMPT, max_tokens=4, frequency_penalty=2.5)
    assert status == 400 and r["error"]["param"].startswith("frequency_penalty"), r


def test_logit_bias_in_llama_servers_forms_as_in_process_generation(server, local):
    # [[id, bias]], [[text, false]] (each of the text's tokens banned), {"id": bias}; and OpenAI's form on
    # /v1/completions. The settings echo them as llama-server does ([{"token", "bias"}], a ban's bias null)
    free = local.generate(PROMPT, max_tokens=24)
    first = free.tokens[0]
    word = local.detokenize([first])
    ids = local.tokenize(word, False)
    want = local.generate(PROMPT, max_tokens=24, logit_bias={t: float("-inf") for t in ids})
    assert want.text != free.text
    for bias in ([[word, False]], [[t, False] for t in ids]):
        status, r = post(server.url, prompt=PROMPT, n_predict=24, temperature=0, logit_bias=bias)
        assert status == 200 and r["content"] == want.text, (bias, r)
    assert {"token": first, "bias": None} in r["generation_settings"]["logit_bias"]
    want = local.generate(PROMPT, max_tokens=24, logit_bias={first: -7.5})
    status, r = post(server.url, prompt=PROMPT, n_predict=24, temperature=0, logit_bias={str(first): -7.5})
    assert status == 200 and r["content"] == want.text, r
    status, r = post(server.url, "/v1/completions", prompt=PROMPT, max_tokens=24, temperature=0,
                     logit_bias={str(first): -7.5})
    assert status == 200 and r["choices"][0]["text"] == want.text, r


def test_streamed_as_llama_server_streams(server, local):
    want = local.generate(PROMPT, max_tokens=24)
    ttft = server.metric("specllm_time_to_first_token_seconds_count")
    events = stream(server.url, prompt=PROMPT, n_predict=24, temperature=0, return_tokens=True)
    assert server.metric("specllm_time_to_first_token_seconds_count") == ttft + 1  # timed as OpenAI streams are
    assert "".join(e["content"] for e in events) == want.text
    assert [t for e in events[:-1] for t in e["tokens"]] == want.tokens
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["timings"]["predicted_n"] == want.stats.n_generated and events[-1]["prompt"]


def test_n_probs_lists_each_tokens_logprob_and_the_most_likely_as_llama_server(server, local):
    want = local.generate(PROMPT, max_tokens=16, logprobs=3)  # values within 0.02: the server verifies in batches
    status, r = post(server.url, prompt=PROMPT, n_predict=16, temperature=0, n_probs=3)
    assert status == 200, r
    probs = r["completion_probabilities"]
    assert [e["id"] for e in probs] == want.tokens
    for e, w in zip(probs, want.logprobs):
        assert e["logprob"] == pytest.approx(w.logprob, abs=0.02) and bytes(e["bytes"]) == local.token_bytes(w.token)
        assert [t["id"] for t in e["top_logprobs"]] == [t for t, _ in w.top] and len(e["top_logprobs"]) == 3
    events = stream(server.url, prompt=PROMPT, n_predict=16, temperature=0, n_probs=3)
    assert [e["id"] for ev in events[:-1] for e in ev["completion_probabilities"]] == want.tokens
    # a stop string's tokens, whose text is cut, are not listed
    stop = want.text[6:9]
    status, r = post(server.url, prompt=PROMPT, n_predict=16, temperature=0, n_probs=1, stop=[stop])
    assert r["content"] == want.text[:want.text.index(stop)]
    assert r["stop_type"] == "word" and r["stopping_word"] == stop
    assert "".join(bytes(e["bytes"]).decode() for e in r["completion_probabilities"]).startswith(r["content"])
    assert len(r["completion_probabilities"]) < len(want.tokens)


def test_a_grammar_or_a_json_schema_constrains_the_completion(server, local):
    want = local.generate(PROMPT, max_tokens=40, grammar=GRAMMAR)
    status, r = post(server.url, prompt=PROMPT, n_predict=40, temperature=0, grammar=GRAMMAR)
    assert status == 200 and r["content"] == want.text and len(r["content"].split(" ")) == 4, r
    assert r["stop_type"] == "eos"
    status, r = post(server.url, prompt=PROMPT, n_predict=60, temperature=0, json_schema=SCHEMA)
    assert status == 200, r
    obj = json.loads(r["content"])
    assert set(obj) == {"n", "ok"} and type(obj["n"]) is int and type(obj["ok"]) is bool


def test_n_predict_0_warms_the_cache_and_ignore_eos_runs_to_n_predict(server, local):
    prompt = "in an the in an the " * 6
    status, r = post(server.url, prompt=prompt, n_predict=0)
    assert status == 200 and r["content"] == "" and r["tokens_predicted"] == 0 and r["stop_type"] == "limit"
    status, r = post(server.url, prompt=prompt + "the", n_predict=4, temperature=0)
    assert status == 200 and r["timings"]["cache_n"] >= len(local.prompt_tokens(prompt)) - 1, r
    status, r = post(server.url, prompt=PROMPT, n_predict=48, temperature=0, ignore_eos=True)
    assert status == 200 and r["tokens_predicted"] == 48 and r["stop_type"] == "limit"


@pytest.mark.parametrize("body, param, code", [
    (dict(prompt=["the"] * 129), "prompt", "invalid_value"),
    (dict(prompt=["the", ""]), "prompt", "invalid_value"),
    (dict(prompt=[[1, 2], [1, 10**9]]), "prompt", "invalid_value"),
    (dict(prompt=["the", "the " * 600]), "prompt", "context_length_exceeded"),
    (dict(prompt=""), "prompt", "invalid_value"),
    (dict(prompt=[]), "prompt", "invalid_value"),
    (dict(prompt=[1, 10**9]), "prompt", "invalid_value"),
    (dict(prompt="a\ud800"), "prompt", "invalid_value"),
    (dict(prompt={"text": "a"}), "prompt", None),
    (dict(prompt="the " * 600), "prompt", "context_length_exceeded"),
    (dict(prompt="the", n_predict=600), "prompt", "context_length_exceeded"),
    (dict(prompt="the", grammar="root ::= ("), "grammar", "invalid_value"),
    (dict(prompt="the", json_schema={"type": "object", "properties": 3}), "json_schema", "invalid_value"),
    (dict(prompt="the", grammar=GRAMMAR, json_schema=SCHEMA), "grammar", "invalid_value"),
    (dict(prompt="the", grammar=GRAMMAR, ignore_eos=True), "ignore_eos", "invalid_value"),
    (dict(prompt="the", n_probs=21), "n_probs", "invalid_value"),
    (dict(prompt="the", n_probs=-1), "n_probs", None),
    (dict(prompt="the", n_probs=2, post_sampling_probs=True), "post_sampling_probs", "unsupported_parameter"),
    (dict(prompt="the", repeat_penalty=0), "repeat_penalty", None),
    (dict(prompt="the", repeat_last_n=-2), "repeat_last_n", None),
    (dict(prompt="the", dry_multiplier=0.8), "dry_multiplier", "unsupported_parameter"),
    (dict(prompt="the", samplers=["top_k", "nonsense"]), "samplers", "invalid_value"),
    (dict(prompt="the", n_predict=-2), "n_predict", None),
    (dict(prompt="the", top_p=0), "top_p", None),
    (dict(prompt="the", logit_bias={"5": "x"}), "logit_bias", "invalid_value"),
    (dict(prompt="the", logit_bias={"5": True}), "logit_bias", "invalid_value"),
    (dict(prompt="the", logit_bias={"99999999": 1}), "logit_bias", "invalid_value"),
    (dict(prompt="the", logit_bias=[[5]]), "logit_bias", "invalid_value"),
    (dict(prompt="the", logit_bias=[[None, 1]]), "logit_bias", "invalid_value"),
    (dict(prompt="the", logit_bias="5"), "logit_bias", None),
])
def test_bad_requests_are_400s_that_name_the_field(server, body, param, code):
    status, r = post(server.url, **body)
    assert status == 400 and r["error"]["param"].split(".")[0] == param, (body, r)
    assert code is None or r["error"]["code"] == code, r


def test_another_models_name_is_a_404_and_the_server_goes_on(server):
    status, r = post(server.url, prompt="the", n_predict=2, model="another")
    assert status == 404, r
    status, r = post(server.url, prompt="the", n_predict=2)
    assert status == 200 and r["tokens_predicted"] == 2


def test_tokenize_detokenize_and_props_as_llama_server(server, local):
    status, r = post(server.url, "/tokenize", content=PROMPT)
    assert status == 200 and r["tokens"] == local.tokenize(PROMPT, False)  # add_special false, as llama-server's
    status, r = post(server.url, "/tokenize", content=PROMPT, add_special=True, with_pieces=True)
    assert [e["id"] for e in r["tokens"]] == local.prompt_tokens(PROMPT)
    want = b"".join(local.token_bytes(t, special=True) for t in local.prompt_tokens(PROMPT)).decode()
    assert "".join(e["piece"] for e in r["tokens"]) == want and PROMPT in want
    ids = local.tokenize(" and", False)
    status, r = post(server.url, "/tokenize", content=["the cat"] + ids)
    assert r["tokens"] == local.tokenize("the cat", False) + ids
    status, r = post(server.url, "/detokenize", tokens=local.tokenize(PROMPT, False))
    assert status == 200 and r["content"].strip() == PROMPT.strip()
    status, r = post(server.url, "/tokenize")
    assert status == 200 and r["tokens"] == []
    for path, body, param in (("/tokenize", {"content": "a\ud800"}, "content"),
                              ("/tokenize", {"content": ["a", 10**9]}, "content"),
                              ("/detokenize", {"tokens": [10**9]}, "tokens"),
                              ("/detokenize", {"tokens": "abc"}, "tokens")):
        status, r = post(server.url, path, **body)
        assert status == 400 and r["error"]["param"].split(".")[0] == param, (path, body, r)
    r = httpx.get(f"{server.url}/props", timeout=30).json()
    assert r["default_generation_settings"]["n_ctx"] == 512 and r["total_slots"] == 1
    assert r["default_generation_settings"]["params"]["temperature"] == 0.8 and r["model_path"]
    assert r["chat_template"] == local.chat_template and r["build_info"].startswith("specllm")
