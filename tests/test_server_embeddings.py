"""Embeddings over HTTP for real: `specllm-cli serve` on a loopback port, driven by the official `openai` client
(whose default encoding is base64) and the `ollama` client, against LLM.embed in-process."""

import os
import signal
import time

import httpx
import numpy as np
import openai
import pytest

import specllm
from helpers import write_variant
from serving import Server

MODEL = "slow"
LONG_TEXT = "the quick brown fox jumps over the lazy dog; " * 60  # ~2,700 tokens: past the context of 2048
TEXTS = ["hello world", "a second, longer text about something else entirely", "x"]
MESSAGES = [{"role": "user", "content": "Name three colours."}]


def start(tiny, tmp_path_factory, *extra):
    log = tmp_path_factory.mktemp("server") / "server.log"
    return Server("--model", tiny["slow"], "--draft", "none", "--threads", "1", "--ctx", "2048", *extra,
                  log_path=log).wait_healthy()


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    s = start(tiny, tmp_path_factory)
    yield s
    assert s.stop(signal.SIGINT) == 0, s.log()


@pytest.fixture(scope="module")
def local(tiny):
    import specllm
    return specllm.LLM(tiny["slow"], None, n_threads=1, n_ctx=2048, profile_costs=False)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def post(server, path, body, timeout=60):
    return httpx.post(f"{server.url}{path}", json=body, timeout=timeout)


def test_openai_client_base64_and_float(server, client, local):
    want = local.embed(TEXTS)
    r = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == MODEL and r.object == "list"
    n = sum(len(t) for t in local.embedding_tokens(TEXTS))
    assert r.usage.prompt_tokens == r.usage.total_tokens == n
    r = client.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
    np.testing.assert_array_equal(np.array(r.data[0].embedding, dtype=np.float32), want[0])
    ids = local.embedding_tokens("hello world")[0]  # token ids, one input and a list of them
    for value in (ids, [ids, ids]):
        r = client.embeddings.create(model=MODEL, input=value)
        np.testing.assert_array_equal(np.array(r.data[-1].embedding, dtype=np.float32), want[0])
    r = post(server, "/embeddings", {"input": "hello world", "dimensions": local.embedding_info["n_embd"]})
    assert r.status_code == 200 and np.array_equal(np.float32(r.json()["data"][0]["embedding"]), want[0])


@pytest.mark.parametrize("body, status, param, code", [
    ({"input": LONG_TEXT}, 400, "input", "context_length_exceeded"),
    ({"input": []}, 400, "input", "invalid_value"),
    ({"input": [5, 10 ** 7]}, 400, "input", "invalid_value"),
    ({"input": "hi", "model": "gpt-4o"}, 404, "model", "model_not_found"),
    ({"input": ["a", ""]}, 400, "input", "invalid_value"),
    ({"input": "hi", "dimensions": 8}, 400, "dimensions", "invalid_value"),
    ({"input": "hi", "dimensions": 0}, 400, None, None),
    ({"input": "hi", "encoding_format": "int8"}, 400, None, None),
    ({"input": 5}, 400, None, None),
    ({"input": [True, False]}, 400, None, None),  # not token ids 1 and 0
    ({}, 400, None, None),
])
def test_bad_requests(server, body, status, param, code):
    r = post(server, "/v1/embeddings", body)
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert error["message"]
    if param:
        assert error["param"] == param
    if code:
        assert error["code"] == code
    assert post(server, "/v1/embeddings", {"input": "still fine"}).status_code == 200


def test_bad_inputs_are_not_counted_as_cancelled_and_say_what_is_wrong(server, local):
    """A failed embedding is a 400, not a client gone: the cancelled counter stays (it went up by each), and an id
    past 32 bits is out of the vocabulary as any other (it was pybind's "incompatible function arguments")."""
    def cancelled():
        return server.metric("specllm_requests_cancelled_total", stage="running") or 0
    before = cancelled()
    for body in ({"input": ""}, {"input": [-1]}, {"input": LONG_TEXT}, {"input": [5, 2 ** 31]},
                 {"input": [5, -2 ** 31 - 1]}, {"input": "hi", "dimensions": 8}):
        r = post(server, "/v1/embeddings", body)
        assert r.status_code == 400 and r.json()["error"]["param"] in ("input", "dimensions"), r.text[:300]
        assert "incompatible" not in r.text and "_core" not in r.text
    assert "vocabulary" in post(server, "/v1/embeddings", {"input": [5, 2 ** 31]}).json()["error"]["message"]
    assert post(server, "/api/embed", {"model": MODEL, "input": LONG_TEXT, "truncate": False}).status_code == 400
    assert cancelled() == before
    for ids in ([5, 2 ** 31], [5, -2 ** 31 - 1], [2 ** 64]):
        with pytest.raises(specllm.InvalidOptionError, match="vocabulary"):
            local.embed(ids)


def test_ollama_embed_and_legacy(server, local):
    import ollama

    o = ollama.Client(host=server.url, timeout=60)
    r = o.embed(model=f"{MODEL}:latest", input=TEXTS)
    np.testing.assert_array_equal(np.array(r.embeddings, dtype=np.float32), local.embed(TEXTS))
    assert r.prompt_eval_count == sum(len(t) for t in local.embedding_tokens(TEXTS))
    r = o.embed(model=MODEL, input=LONG_TEXT)  # Ollama's default: cut to the context
    np.testing.assert_array_equal(np.array(r.embeddings[0], dtype=np.float32), local.embed(LONG_TEXT, truncate=True))
    assert r.prompt_eval_count == 2048
    with pytest.raises(ollama.ResponseError) as e:
        o.embed(model=MODEL, input=LONG_TEXT, truncate=False)
    assert e.value.status_code == 400 and "2048" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        o.embed(model="llama3", input="hi")
    assert e.value.status_code == 404
    cut = o.embed(model=MODEL, input=TEXTS, dimensions=16).embeddings  # Ollama's: cut, normalized again
    want = local.embed(TEXTS)[:, :16]
    np.testing.assert_allclose(cut, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    with pytest.raises(ollama.ResponseError) as e:
        o.embed(model=MODEL, input="hi", dimensions=10000)
    assert e.value.status_code == 400 and "dimensions" in str(e.value)
    for empty in ({"model": MODEL}, {"model": MODEL, "input": ""}, {"model": MODEL, "input": []}):
        r = post(server, "/api/embed", empty)  # Ollama's way to load a model: no embeddings
        assert r.status_code == 200 and r.json()["embeddings"] == []
    assert post(server, "/api/embeddings", {"model": MODEL}).json() == {"embedding": []}
    legacy = o.embeddings(model=MODEL, prompt="hello world").embedding  # not normalized, as Ollama's
    np.testing.assert_allclose(legacy, local.embed("hello world", normalize=False), rtol=1e-6)
    assert abs(np.linalg.norm(legacy) - 1) > 0.1


def test_metrics_count_embedded_tokens(server, local):
    before = server.metric("specllm_embedded_tokens_total")
    assert post(server, "/v1/embeddings", {"input": TEXTS}).status_code == 200
    n = sum(len(t) for t in local.embedding_tokens(TEXTS))
    assert server.metric("specllm_embedded_tokens_total") == before + n
    assert server.metric("specllm_requests_total", endpoint="/v1/embeddings", status="200") >= 1


def test_waits_behind_a_generation_and_a_client_gone_while_queued_is_skipped(server, client):
    before = server.metric("specllm_requests_cancelled_total", stage="queued")
    embedded = server.metric("specllm_embedded_tokens_total")
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=30,
                      json={"messages": MESSAGES, "max_tokens": 1500, "stream": True}) as running:
        lines = running.iter_lines()  # kept: a dropped line iterator closes the connection
        next(lines)
        with pytest.raises(httpx.ReadTimeout):  # queued behind the generation, then given up
            post(server, "/v1/embeddings", {"input": TEXTS}, timeout=1.0)
        assert server.wait_metric("specllm_requests_cancelled_total", before + 1, stage="queued") == before + 1
    r = client.embeddings.create(model=MODEL, input="after")
    assert len(r.data) == 1
    # the skipped request embedded nothing: only "after" was counted
    assert server.metric("specllm_embedded_tokens_total") == embedded + r.usage.prompt_tokens


def test_a_client_gone_while_its_embedding_runs_stops_it(server, client):
    before = server.metric("specllm_requests_cancelled_total", stage="running")
    embedded = server.metric("specllm_embedded_tokens_total")
    body = {"input": [LONG_TEXT[:1800]] * 60}  # 60 x ~1,800 tokens: far longer than the wait below
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/v1/embeddings", body, timeout=1.0)
    assert server.wait_metric("specllm_requests_cancelled_total", before + 1, stage="running") == before + 1
    t0 = time.monotonic()
    r = client.embeddings.create(model=MODEL, input="after")  # served at once: the cancelled job has stopped
    assert time.monotonic() - t0 < 5 and len(r.data) == 1
    assert server.metric("specllm_embedded_tokens_total") == embedded + r.usage.prompt_tokens


@pytest.fixture(scope="module")
def embedding_model(tiny, tmp_path_factory):
    """An embedding model's GGUF: the tiny target's weights declaring mean pooling (named "embedder")."""
    return write_variant(tiny["target"], tmp_path_factory.mktemp("emb") / "embedder.gguf",
                         keys={"llama.pooling_type": 1})


def test_serve_with_an_embedding_model(tiny, tmp_path_factory, embedding_model, local):
    import specllm

    s = start(tiny, tmp_path_factory, "--embedding-model", embedding_model)
    try:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=60)
        assert [m.id for m in c.models.list().data] == [MODEL, "embedder"]
        assert c.models.retrieve("embedder").id == "embedder"
        tags = httpx.get(f"{s.url}/api/tags", timeout=10).json()["models"]
        assert [m["name"] for m in tags] == [f"{MODEL}:latest", "embedder:latest"]
        assert tags[1]["size"] == os.path.getsize(embedding_model)
        with specllm.LLM(tiny["slow"], None, n_threads=1, n_ctx=2048, profile_costs=False,
                         embedding_model=embedding_model) as ref:
            want = ref.embed(TEXTS)
        assert want.shape == (3, 64) and local.embed(TEXTS).shape == (3, 512)  # not the chat model's
        for name in ("embedder", MODEL, None):  # the answer names the model that embedded
            kw = {} if name is None else {"model": name}
            r = c.embeddings.create(input=TEXTS, **kw) if name else httpx.post(
                f"{s.url}/v1/embeddings", json={"input": TEXTS}, timeout=60).json()
            data = r["data"] if isinstance(r, dict) else [d.model_dump() for d in r.data]
            np.testing.assert_array_equal(np.array([d["embedding"] for d in data], dtype=np.float32), want)
            assert (r["model"] if isinstance(r, dict) else r.model) == "embedder"
        show = httpx.post(f"{s.url}/api/show", json={"model": "embedder:latest"}, timeout=10).json()
        assert show["capabilities"] == ["embedding"]
        assert "embedding" not in httpx.post(f"{s.url}/api/show", json={"model": MODEL}, timeout=10).json()[
            "capabilities"]
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="embedder", messages=MESSAGES, max_tokens=4)
        assert c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4).choices[0].message.content
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


def test_an_embedding_model_named_as_the_chat_model_is_listed_once(tiny, tmp_path_factory):
    same = write_variant(tiny["target"], tmp_path_factory.mktemp("same") / f"{MODEL}.gguf",
                         keys={"llama.pooling_type": 1})
    s = start(tiny, tmp_path_factory, "--embedding-model", same)
    try:
        assert [m["id"] for m in httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"]] == [MODEL]
        assert [m["name"] for m in httpx.get(f"{s.url}/api/tags", timeout=10).json()["models"]] == [f"{MODEL}:latest"]
        r = httpx.post(f"{s.url}/v1/embeddings", json={"input": TEXTS, "model": MODEL}, timeout=60).json()
        assert r["model"] == MODEL and len(r["data"]) == len(TEXTS)
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


def test_serve_with_a_bad_embedding_model_fails_at_start(tiny, tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    s = Server("--model", tiny["slow"], "--draft", "none", "--threads", "1", "--embedding-model",
               str(tmp_path / "bad.gguf"), log_path=tmp_path / "server.log")
    try:
        assert s.proc.wait(60) != 0
        assert "not a GGUF file" in s.log()
    finally:
        s.stop()
