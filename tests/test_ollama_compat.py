"""Ollama's API where Ollama's own server is lenient or particular, in-process (TestClient) on the tiny tools model
with a 256-token context: num_predict past the context is capped, a conversation longer than the context loses its
oldest messages, a JSON null is a field not given, the option names Ollama knows change nothing, keep_alive, think,
raw, an empty suffix and roles are read as Ollama reads them, logprobs come in Ollama's shape, and / answers the
ollama CLI's heartbeat (server/routes.go, server/prompt.go, api/types.go)."""

import json

import pytest
from fastapi.testclient import TestClient

MODEL = "tiny-tools"
N_CTX = 256
HI = [{"role": "user", "content": "hi"}]
# a thinking model's template, as Qwen3's: enable_thinking false writes an empty thought before the reply
THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
            "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def llm(tiny_tools, make_llm):
    return make_llm(tiny_tools, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def client(llm):
    from specllm.server import create_app

    with TestClient(create_app(llm)) as c:
        yield c


def chat(client, messages=HI, **fields):
    body = {"model": MODEL, "messages": messages, "stream": False, "options": {"temperature": 0, "num_predict": 2}}
    return client.post("/api/chat", json={**body, **fields})


def generate(client, **fields):
    body = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"temperature": 0, "num_predict": 2}}
    return client.post("/api/generate", json={**body, **fields})


def n_prompt(body: dict) -> int:
    assert body["prompt_eval_cached_count"] == body["speculative"]["prompt_tokens_cached"]
    return body["prompt_eval_count"]


def error(r, status: int = 400) -> str:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_num_predict_past_the_context_is_capped(client, llm):
    for r in (chat(client, options={"temperature": 0, "num_predict": 2 * N_CTX}),
              generate(client, options={"temperature": 0, "num_predict": N_CTX}, raw=True)):
        assert r.status_code == 200, r.text
        body = r.json()
        assert n_prompt(body) + body["eval_count"] <= N_CTX
        assert body["done_reason"] == "stop" or n_prompt(body) + body["eval_count"] == N_CTX
    words = "a " * N_CTX  # one token a word and more: no room at all
    assert "exceeds the context length" in error(generate(client, prompt=words, raw=True))


def test_null_is_a_field_not_given(client):
    # the body langchain_community's Ollama LLM posts: every option it knows, unset ones as null
    options = {k: None for k in ("mirostat", "mirostat_eta", "mirostat_tau", "num_ctx", "num_gpu", "num_thread",
                                 "repeat_last_n", "repeat_penalty", "temperature", "stop", "tfs_z", "top_k",
                                 "top_p", "typical_p")}
    r = generate(client, options=dict(options, num_predict=2), images=None, format=None, system=None,
                 template=None, keep_alive=None, raw=None, suffix=None, context=None, think=None)
    assert r.status_code == 200 and r.json()["eval_count"] == 2, r.text
    r = client.post("/api/chat", json={"model": MODEL, "messages": HI, "stream": None, "format": None,
                                       "tools": None, "options": {"num_predict": 2, "seed": None}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")  # streamed
    assert json.loads(r.text.splitlines()[-1])["done"]


def test_the_options_ollama_knows_change_nothing_and_a_typo_is_named(client):
    want = chat(client).json()["message"]["content"]
    for extra in ({"f16_kv": True}, {"draft_num_predict": 4}, {"num_gqa": 8, "rope_frequency_base": 1e6},
                  {"rope_frequency_scale": 1.0, "low_vram": False, "num_keep": 4}, {"num_predict": 2.0}):
        r = chat(client, options={"temperature": 0, "num_predict": 2, **extra})
        assert r.status_code == 200 and r.json()["message"]["content"] == want, (extra, r.text)
    assert r.json()["eval_count"] == 2  # num_predict 2.0, as Go decodes a JSON number
    assert "did you mean 'num_predict'" in error(chat(client, options={"num_predicts": 2}))
    assert "options.num_predict must be an integer" in error(chat(client, options={"num_predict": 2.5}))
    assert "options.top_k must be an integer" in error(chat(client, options={"top_k": 4.5}))


def _conversation(n_turns: int, with_tools: bool = False) -> list:
    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"Question {i}: tell me more about it"})
        if with_tools:  # each answer a tool call and its result
            msgs += [{"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "look", "arguments": {"q": str(i)}}}]},
                {"role": "tool", "content": f"result {i} of the lookup", "tool_name": "look"}]
        msgs.append({"role": "assistant", "content": f"Answer {i}: it is a thing"})
    return msgs + [{"role": "user", "content": "Last question: hi"}]


def _prompt_length(llm, messages: list) -> int:
    """Prompt tokens of an Ollama conversation, as the chat template gets it (arguments as JSON text)."""
    chat = [dict(m, tool_calls=[{"id": "x", "type": "function", "function": dict(
        c["function"], arguments=json.dumps(c["function"]["arguments"]))} for c in m["tool_calls"]])
        if "tool_calls" in m else m for m in messages]
    return len(llm.prompt_tokens(llm.apply_chat_template(chat)))


def _longest_tail(llm, msgs: list, room: int) -> int:
    """Prompt tokens of the system message and the longest tail that leaves room tokens, begun by a user message
    (truncate.py: not by a tool's result whose call was cut, nor by an assistant's turn)."""
    starts = [i for i in range(1, len(msgs)) if msgs[i]["role"] == "user"]
    return next(n for n in (_prompt_length(llm, msgs[:1] + msgs[i:]) for i in starts) if n + room <= N_CTX)


@pytest.mark.parametrize("with_tools", [False, True])
def test_a_long_conversation_loses_its_oldest_messages(client, llm, with_tools):
    msgs = _conversation(12, with_tools)
    assert _prompt_length(llm, msgs) > N_CTX
    kept = n_prompt(chat(client, msgs).json())
    assert kept == _longest_tail(llm, msgs, 2)  # num_predict 2: room for 2 tokens
    body = chat(client, msgs, options={"temperature": 0}).json()  # no num_predict: room for a quarter
    assert n_prompt(body) == _longest_tail(llm, msgs, N_CTX // 4) <= kept
    too_long = msgs[:-1] + [{"role": "user", "content": "a " * N_CTX}]
    assert "exceeds the context length" in error(chat(client, too_long))
    assert "exceeds the context length" in error(chat(client, msgs, truncate=False))  # Ollama's: not cut
    # a reply begun after a long last question: kept with the question, so still continued; with a question too
    # long to keep, the 400 (the begun reply alone was closed as a turn of its own and answered anew)
    begun = [msgs[0], {"role": "user", "content": "w " * 150}, {"role": "assistant", "content": "The answer is"}]
    r = chat(client, msgs[:-1] + begun[1:]).json()
    assert n_prompt(r) == len(llm.prompt_tokens(llm.apply_chat_template(begun[:2]) + "The answer is")), r
    begun[1]["content"] = "w " * N_CTX
    assert "exceeds the context length" in error(chat(client, msgs[:-1] + begun[1:]))
    assert n_prompt(chat(client, msgs, truncate=None).json()) == kept  # null: not given, cut


def test_the_root_and_head_answer_as_ollama_does(client):
    r = client.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    for path in ("/", "/api/version", "/api/tags"):
        assert client.head(path).status_code == 200, path


def test_an_empty_suffix_is_no_suffix(client):
    # the model has no fill-in-the-middle tokens: a suffix is a 400, "" none
    assert generate(client, suffix="").json()["response"] == generate(client).json()["response"]
    assert "FIM" in error(generate(client, suffix="x"))


def test_think_is_checked_and_false_turns_thinking_off(client, tiny_tools, make_llm):
    from specllm.server import create_app

    assert error(chat(client, think=True)) == '"tiny-tools" does not support thinking'
    assert error(generate(client, think="high")) == '"tiny-tools" does not support thinking'
    assert "invalid think value" in error(chat(client, think="bogus"))
    assert "think must be a boolean or string" in error(chat(client, think=1))
    assert chat(client, think=False).status_code == 200
    thinker = make_llm(tiny_tools, n_ctx=N_CTX, chat_template=THINKING)
    with TestClient(create_app(thinker)) as c:
        assert "thinking" in c.post("/api/show", json={"model": MODEL}).json()["capabilities"]
        for think, kwargs in ((True, {}), (None, {}), (False, {"enable_thinking": False})):
            want = len(thinker.prompt_tokens(thinker.apply_chat_template(HI, chat_template_kwargs=kwargs)))
            assert n_prompt(chat(c, think=think).json()) == want, think


def test_raw_with_system_and_system_without_a_template_are_refused(client, make_llm, tmp_path):
    from models.tiny import write_tiny_model

    from specllm.server import create_app

    assert error(generate(client, raw=True, system="be a pirate")) == \
        "raw mode does not support template, system, or context"
    plain = make_llm(write_tiny_model(tmp_path / "plain.gguf", chat_template=""), n_ctx=N_CTX)
    assert not plain.chat_template
    with TestClient(create_app(plain)) as c:
        assert c.post("/api/generate", json={"model": "plain", "prompt": "hi", "stream": False,
                                             "options": {"num_predict": 2}}).status_code == 200
        r = c.post("/api/generate", json={"model": "plain", "prompt": "hi", "system": "be a pirate",
                                          "stream": False, "options": {"num_predict": 2}})
        assert "this model has none" in error(r)


def test_keep_alive_unloads_and_is_checked(client):
    assert chat(client, [], keep_alive=0).json()["done_reason"] == "unload"
    assert chat(client, [], keep_alive="5m").json()["done_reason"] == "load"
    assert generate(client, prompt="", keep_alive="0").json()["done_reason"] == "unload"
    for good in (0, -1, 300, "-1m", "1h30m", ".5h", "0"):
        assert chat(client, keep_alive=good).status_code == 200, good
    for bad, words in (("forever", "invalid duration"), ("10", "missing unit"), (True, "Unsupported type")):
        assert words in error(chat(client, keep_alive=bad)), bad


def test_roles_are_lower_cased(client):
    assert n_prompt(chat(client, [{"role": "User", "content": "hi"}]).json()) == n_prompt(chat(client).json())


def test_logprobs_in_ollamas_shape(client, llm):
    body = generate(client, logprobs=True, top_logprobs=2, options={"temperature": 0, "num_predict": 3}).json()
    assert len(body["logprobs"]) == 3
    for e in body["logprobs"]:
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] and e["logprob"] <= 0
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["logprob"]  # greedy: the top
    assert "".join(e["token"] for e in body["logprobs"]) == body["response"]
    with client.stream("POST", "/api/chat", json={"model": MODEL, "messages": HI, "logprobs": True,
                                                  "options": {"temperature": 0, "num_predict": 3}}) as s:
        lines = [json.loads(line) for line in s.iter_lines() if line]
    entries = [e for x in lines for e in x.get("logprobs", [])]
    assert len(entries) == 3 and all("top_logprobs" not in e for e in entries)
    assert "".join(e["token"] for e in entries) == "".join(x["message"]["content"] for x in lines)
    assert "logprobs" not in chat(client).json()
    assert error(chat(client, logprobs=True, top_logprobs=21)) == "top_logprobs must be between 0 and 20"


def test_the_embedding_model_does_not_chat(tiny, tiny_tools, make_llm, tmp_path):
    from helpers import write_variant

    from specllm.server import create_app

    emb = write_variant(tiny["target"], tmp_path / "embedder.gguf", keys={"llama.pooling_type": 1})
    with TestClient(create_app(make_llm(tiny_tools, n_ctx=N_CTX, embedding_model=str(emb)))) as c:
        assert error(chat(c, model="embedder")) == '"embedder" does not support chat'
        assert error(generate(c, model="embedder:latest")) == '"embedder:latest" does not support generate'
        assert error(chat(c, model="llama3"), 404).startswith("model 'llama3' not found")
        assert error(generate(c, model="")).startswith("model is required")
        assert c.post("/api/embed", json={"model": "", "input": "x"}).status_code == 404  # as Ollama's EmbedHandler
    with TestClient(create_app(make_llm(tiny_tools, n_ctx=N_CTX), api_key="k")) as c:
        assert c.head("/").status_code == 200 and c.get("/").text == "Ollama is running"  # the CLI's heartbeat
        assert c.get("/api/tags").status_code == 401


def test_the_quantization_level_and_tool_calls_are_ollamas(client):
    from specllm.server import ollama

    assert client.get("/api/tags").json()["models"][0]["details"]["quantization_level"] == "F32"  # "all F32"
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
             for i in range(2)]
    assert ollama._ollama_calls(calls) == [
        {"id": f"call_{i}", "function": {"index": i, "name": "f", "arguments": {"a": 1}}} for i in range(2)]


@pytest.mark.parametrize("llama_cpp,ollama_name", [
    ("Q4_K - Medium", "Q4_K_M"), ("Q3_K - Small", "Q3_K_S"), ("Q5_K - Large", "Q5_K_L"),
    ("IQ4_XS - 4.25 bpw", "IQ4_XS"), ("F16", "F16"), ("Q8_0", "Q8_0"), ("all F32", "F32"),
    ("IQ3_S mix - 3.66 bpw", "IQ3_M"), ("Q4_K - Medium (guessed)", "Q4_K_M")])
def test_quantization_names(llama_cpp, ollama_name):
    from specllm.server.ollama_models import quantization

    assert quantization(llama_cpp) == ollama_name
