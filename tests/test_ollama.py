"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version) on a real `specllm-cli serve`,
driven by the official `ollama` client: greedy replies are the chat replies of the same conversation, streamed as
NDJSON with Ollama's counts, tool calls in the conversation go back into the prompt, `format` constrains the reply,
and errors are Ollama's {"error": ...}. The tiny model has a Hermes-style template (models/tiny.py "tools")."""

import json
import tempfile

import httpx
import ollama
import pytest
from fastapi.testclient import TestClient

ASK = "What is the weather in Paris?"
GREEDY = {"temperature": 0, "num_predict": 24}
MODEL = "tiny-tools"


@pytest.fixture(scope="module")
def server(tools_server):
    return tools_server


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture(scope="module")
def local(tools_local):
    return tools_local


def test_the_server_says_where_the_apis_are(server):
    assert "ready: serving 'tiny-tools' (draft: " in server.log() and "/api (Ollama)" in server.log()


def test_the_model_is_listed_and_shown(client):
    (card,) = client.list().models
    assert card.model == f"{MODEL}:latest" and card.details.format == "gguf" and card.details.family == "llama"
    assert card.size > 1_000_000
    shown = client.show(MODEL)
    assert "tools" in shown.capabilities and "completion" in shown.capabilities and "insert" not in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == 2048 and "<tool_call>" in shown.template
    assert client.ps().models[0].context_length == 2048
    assert httpx.get(f"{client._client.base_url}/api/version", timeout=10).json()["version"]


def test_a_chat_reply_is_the_chat_reply_whole_and_streamed(server, client, local):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": ASK}]
    want = local.chat(messages, max_tokens=24)
    r = client.chat(model=MODEL, messages=messages, options=GREEDY, stream=False)
    assert r.message.role == "assistant" and r.message.content == want.text
    assert r.done and r.done_reason == "length" and r.eval_count == 24 and r.total_duration > 0
    assert r.prompt_eval_count == want.stats.n_prompt  # every prompt token, as Ollama counts them
    ttft = server.metric("specllm_time_to_first_token_seconds_count")
    parts = list(client.chat(model=f"{MODEL}:latest", messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == want.text
    assert server.metric("specllm_time_to_first_token_seconds_count") == ttft + 1  # Ollama's streams timed too
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done and parts[-1].eval_count == 24
    # the same prompt again: read from the cache, and still counted whole (it read 1 here: clients that track the
    # context's use from it got a wrong number)
    assert parts[-1].prompt_eval_count == want.stats.n_prompt
    again = httpx.post(f"{client._client.base_url}/api/chat", timeout=60,
                       json={"model": MODEL, "messages": messages, "options": GREEDY, "stream": False}).json()
    assert again["prompt_eval_count"] == want.stats.n_prompt
    assert 0 < again["prompt_eval_cached_count"] < want.stats.n_prompt  # (this client's types have no field for it)
    # without "stream", Ollama's API streams: NDJSON lines
    r = httpx.post(f"{client._client.base_url}/api/chat", json={"model": MODEL, "messages": messages,
                                                               "options": GREEDY}, timeout=60)
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert "".join(x["message"]["content"] for x in lines) == want.text and lines[-1]["done"]


def test_the_repetition_penalties_in_options_are_applied(client, local):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": ASK}]
    options = {"repeat_penalty": 1.5, "repeat_last_n": 16, "frequency_penalty": 1.0, "presence_penalty": 0.5}
    want = local.chat(messages, max_tokens=24, repeat_penalty=1.5, penalty_last_n=16, frequency_penalty=1.0,
                      presence_penalty=0.5)
    assert want.text != local.chat(messages, max_tokens=24).text
    r = client.chat(model=MODEL, messages=messages, options={**GREEDY, **options}, stream=False)
    assert r.message.content == want.text


def test_generate_in_the_chat_template_raw_and_loading(client, local):
    # 8 tokens: the prompt's start comes from the KV cache of the requests before, computed in other batches than
    # a fresh plain decoding's, and further on a near-tie of the random tiny model flips
    want = local.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}], max_tokens=8)
    r = client.generate(model=MODEL, prompt=ASK, system="Be brief.", options={"temperature": 0, "num_predict": 8})
    assert r.response == want.text and r.done_reason == "length"  # the client's default: not streamed
    raw = client.generate(model=MODEL, prompt="The cat sat", raw=True, options=GREEDY, stream=False)
    assert raw.response == local.generate("The cat sat", max_tokens=24).text
    assert client.generate(model=MODEL, prompt="").done_reason == "load"  # how clients load a model
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"


def test_a_tool_call_and_its_result_go_back_into_the_prompt(server, local):
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}
    messages = [{"role": "user", "content": ASK},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "rain", "tool_name": "get_weather"}]
    r = httpx.post(f"{server.url}/api/chat", json={"model": MODEL, "messages": messages, "tools": [tool],
                                                    "stream": False, "options": GREEDY}, timeout=60).json()
    prompt = local.apply_chat_template(
        [messages[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "content": "rain"}], tools=[tool])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    n = len(local.prompt_tokens(prompt))
    assert r["prompt_eval_count"] == n and r["prompt_eval_cached_count"] == r["speculative"]["prompt_tokens_cached"]


SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def test_format_constrains_the_reply(client):
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Pick a colour."}], format=SCHEMA,
                    options={"temperature": 0, "num_predict": 40}, stream=False)
    assert json.loads(r.message.content)["colour"] in ("red", "green", "blue") and r.done_reason == "stop"
    r = client.generate(model=MODEL, prompt="Give JSON.", format="json", options={"num_predict": 60, "seed": 3},
                        stream=False)
    assert r.done_reason == "length" or isinstance(json.loads(r.response), dict)


BAD = [
    ("/api/chat", {"model": "llama3"}, 404, "not found"),
    ("/api/chat", {"options": {"repeat_penalty": 0}}, 400, "repeat_penalty"),
    ("/api/chat", {"options": {"repeat_last_n": -5}}, 400, "repeat_last_n"),
    ("/api/chat", {"options": {"tfs_z": 0.5}}, 400, "tfs_z"),
    ("/api/chat", {"options": {"repeat_penalty": 1.3, "repeat_last_n": 32, "num_ctx": 8192, "num_predict": 2}},
     200, None),
    ("/api/chat", {"options": {"no_such": 1}}, 400, "no_such"),
    ("/api/chat", {"options": {"num_predict": "many"}}, 400, "num_predict"),
    ("/api/chat", {"options": {"seed": "x"}}, 400, "seed"),
    ("/api/chat", {"options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/chat", {"options": {"seed": -1, "temperature": 0, "num_predict": 2}}, 200, None),
    ("/api/chat", {"format": "xml"}, 400, "format"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "images"),
    ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/api/chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, 400, "function.name"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {"prompt": "x", "options": {"top_p": 7}}, 400, "top_p"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, 400, "context"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, 400, "FIM"),
    ("/api/show", {"model": "llama3"}, 404, "not found"),
    ("/api/show", {"model": None}, 400, "model is required"),
]


@pytest.mark.parametrize("path,fields,status,words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_are_ollamas_errors(server, path, fields, status, words):
    body = {"model": MODEL, "messages": [{"role": "user", "content": ASK}], "stream": False,
            "options": {"num_predict": 2}} if path == "/api/chat" else {"model": MODEL, "stream": False}
    r = httpx.post(f"{server.url}{path}", json={**body, **fields}, timeout=30)
    assert r.status_code == status, r.text
    if status != 200:
        assert isinstance(r.json()["error"], str) and words in r.json()["error"], r.text
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_client_raises_its_response_error(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and "not found" in e.value.error


def test_a_client_that_leaves_mid_stream_stops_the_generation(server, client):
    before = server.metric("specllm_requests_cancelled_total", stage="running")
    parts = client.chat(model=MODEL, messages=[{"role": "user", "content": ASK}], options={"num_predict": 1500},
                        stream=True)
    for n, _ in enumerate(parts):
        if n >= 4:
            break
    parts.close()  # the generator's end closes its response, and so the connection
    assert server.wait_metric("specllm_requests_cancelled_total", before + 1, stage="running") == before + 1


def test_fill_in_the_middle_and_an_error_midway(tiny, make_llm):
    from models.tiny import write_tiny_model
    from test_server_app import failing_stream

    from specllm.server import create_app

    with tempfile.TemporaryDirectory() as d:
        llm = make_llm(write_tiny_model(f"{d}/tiny-fim.gguf", seed=0, vocab="byte-fim", name="tiny-fim"))
        with TestClient(create_app(llm)) as c:
            body = {"model": "tiny-fim", "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n",
                    "stream": False, "options": {"temperature": 0, "num_predict": 12}}
            r = c.post("/api/generate", json=body)
            want = llm.generate(body["prompt"], suffix=body["suffix"], max_tokens=12)
            assert r.status_code == 200 and r.json()["response"] == want.text
            assert "insert" in c.post("/api/show", json={"model": "tiny-fim"}).json()["capabilities"]
            restore = failing_stream(llm, after=2)
            with c.stream("POST", "/api/generate", json=dict(body, stream=True)) as s:
                lines = [json.loads(line) for line in s.iter_lines() if line]
            restore()
            assert "llama_decode failed" in lines[-1]["error"] and not any(x.get("done") for x in lines)
