"""create_app in-process (starlette's TestClient runs the ASGI app and its lifespan): what a subprocess cannot
easily provoke — a decode error in the middle of a generation, a model still loading, a body without a length."""

import json
import re
import threading
import time

import pytest
from fastapi.testclient import TestClient

import specllm
from specllm.server import create_app

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def llm(tiny, make_llm):
    return make_llm(tiny["target"], tiny["draft"])


def failing_stream(llm, after):
    """llm.stream, but the engine's step raises a SpecLLMError after `after` steps (as a failed llama_decode does)."""
    real_step, n = llm._engine.step, [0]

    class Engine:  # the engine with a step that fails; everything else passes through
        def __getattr__(self, name):
            return getattr(real_engine, name)

        def step(self):
            n[0] += 1
            if n[0] > after:
                raise specllm.SpecLLMError("llama_decode failed (test)")
            return real_step()

    real_engine = llm._engine
    llm._engine = Engine()
    return lambda: setattr(llm, "_engine", real_engine)


def test_a_decode_error_is_a_500_and_the_server_goes_on(llm):
    with TestClient(create_app(llm)) as c:
        restore = failing_stream(llm, after=2)
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 20})
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and "llama_decode failed" in err["message"]
        assert "Traceback" not in r.text
        # streaming: the headers are out, so the error arrives as an event
        with c.stream("POST", "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 20,
                                                              "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert any('"error"' in line for line in lines) and lines[-1] == "data: [DONE]"
        restore()
        assert not llm._engine.active  # the failed generation was ended, the KV cache kept consistent
        ok = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 20})
        assert ok.status_code == 200
        assert ok.json()["choices"][0]["message"]["content"] == llm.chat(MESSAGES, max_tokens=20).text


def test_health_is_503_while_the_model_loads(tiny, make_llm):
    go = threading.Event()

    def load():
        assert go.wait(30)
        return make_llm(tiny["target"], None)

    with TestClient(create_app(load)) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading" and r.headers["retry-after"]
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        for path, body in (("/v1/responses", {"input": "hi"}), ("/v1/messages", {"messages": MESSAGES}),
                           ("/api/chat", {"model": "target", "messages": MESSAGES})):  # each in its API's shape
            r = c.post(path, json=body)
            assert r.status_code == 503 and "loading" in json.dumps(r.json()), (path, r.text)
        assert r.json() == {"error": r.json()["error"]} and isinstance(r.json()["error"], str)  # Ollama's
        assert c.get("/v1/models").json()["data"] == []  # no id yet: it named a model "loading"
        assert c.get("/v1/models/target").status_code == 503
        r = c.head("/health")  # uptime monitors
        assert r.status_code == 503 and r.content == b""
        go.set()
        for _ in range(300):
            if c.get("/health").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/v1/models").json()["data"][0]["id"] == "target"
        assert c.head("/health").status_code == 200
    never = threading.Event()

    def held():
        assert never.wait(30)
        raise specllm.SpecLLMError("not loaded (test)")

    with TestClient(create_app(held, model_id="target")) as c:  # the CLI gives the id: listed while it loads
        assert c.get("/health").status_code == 503
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["target"]
        never.set()


def test_stopping_while_the_load_measures_its_costs_ends_the_load_at_once(tiny, tmp_path, monkeypatch):
    """The load's cost measurement (a minute on a 2-core CPU) held the worker's thread past the server's stop: the
    process waited 2 x 10 s, then died in llama.cpp as Python exited (SIGSEGV), and 'ready' was logged after the
    stop. Here the measurement begins once the stop is set: it must end at its first timed step."""
    from specllm import costs, profile
    from specllm.server.metrics import Metrics
    from specllm.server.worker import Worker

    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))
    real, measuring = profile.load_or_measure, threading.Event()

    def held(*args, **kw):
        measuring.set()
        assert costs._loading.stop.wait(30)  # the worker's stop, as the load on this thread sees it
        time.sleep(0.2)  # the watcher has interrupted the engine
        return real(*args, **kw)

    monkeypatch.setattr(profile, "load_or_measure", held)
    ready = []
    worker = Worker(lambda: specllm.LLM(tiny["target"], tiny["draft"], n_threads=1), 4, Metrics())
    worker.on_ready = ready.append
    worker.start()
    assert measuring.wait(60)
    t0 = time.monotonic()
    worker.stop()
    assert time.monotonic() - t0 < 5 and not worker._thread.is_alive()
    assert worker.llm is None and worker.load_error is None and not ready
    assert not list(tmp_path.glob("*.json"))  # no half-measured profile kept (its lock file may stay)


def test_a_failed_load_is_reported(tmp_path):
    def load():
        return specllm.LLM(str(tmp_path / "missing.gguf"), None)

    with TestClient(create_app(load)) as c:
        for _ in range(300):
            r = c.get("/health")
            if r.json()["status"] != "loading":
                break
            threading.Event().wait(0.05)
        assert r.status_code == 503 and r.json()["status"] == "error" and "missing.gguf" in r.json()["error"]
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
        r = c.get("/v1/models")  # no model to name, and why
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"


def test_a_body_without_a_length_is_capped(llm):
    with TestClient(create_app(llm, max_body=1000)) as c:
        def body():
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}]}'
        r = c.post("/v1/chat/completions", content=body(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}).status_code == 200


def test_cors_only_when_asked(llm):
    with TestClient(create_app(llm)) as c:
        r = c.options("/v1/models", headers={"Origin": "http://x.test", "Access-Control-Request-Method": "GET"})
        assert "access-control-allow-origin" not in r.headers
    for origins in (["http://x.test"], (o for o in ["http://x.test"])):  # a generator was used up by the check
        with TestClient(create_app(llm, cors_origins=origins)) as c:
            r = c.get("/v1/models", headers={"Origin": "http://x.test"})
            assert r.headers["access-control-allow-origin"] == "http://x.test"
    with TestClient(create_app(llm, cors_origins=["http://x.test"])) as c:
        # the preflight of openai-node and Anthropic's TypeScript SDK in a browser: headers of their own (a 400)
        asked = ("authorization, content-type, x-stainless-lang, x-stainless-os, x-stainless-retry-count, "
                 "x-stainless-timeout")
        ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked}
        r = c.options("/v1/chat/completions", headers={"Origin": "http://x.test", **ask})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://x.test", r.text
        r = c.options("/v1/chat/completions", headers={"Origin": "http://evil.test", **ask})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers  # the origins are the gate
    with TestClient(create_app(llm, cors_origins=None, api_key=" k ")) as c:  # None: none; the key read stripped
        assert c.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
        assert c.get("/v1/models").status_code == 401


def test_later_choices_and_prompts_of_a_request_taken_are_not_refused_by_a_full_queue(llm, monkeypatch):
    """Each later choice (n > 1) or prompt (a list) was queued as a new request: where other clients had filled the
    queue meanwhile, an admitted n=3 stream ended after its first choice with queue_full (17 of 72 streams under 24
    clients), a whole answer with a 429 after its first choice was generated. Here the queue is full for every
    request but the first job of each."""
    from specllm.server import worker as worker_module

    real_submit = worker_module.Worker.submit

    def full_for_new_requests(self, job, admitted=False):
        if not admitted and self.n_submitted > 0:
            raise worker_module.QueueFull
        self.n_submitted += 1
        return real_submit(self, job, admitted) if admitted else real_submit(self, job)

    monkeypatch.setattr(worker_module.Worker, "submit", full_for_new_requests)
    with TestClient(create_app(llm)) as c:
        def one(path, body):
            c.app.state.specllm.worker.n_submitted = 0  # a new request: its first job is let in
            return c.post(path, json=body)

        r = one("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "n": 3})
        assert r.status_code == 200 and [ch["index"] for ch in r.json()["choices"]] == [0, 1, 2], r.text
        c.app.state.specllm.worker.n_submitted = 0
        with c.stream("POST", "/v1/chat/completions",
                      json={"messages": MESSAGES, "max_tokens": 4, "n": 2, "stream": True}) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert not [e for e in events if "error" in e], events
        assert {ch["index"] for e in events for ch in e["choices"] if ch.get("finish_reason")} == {0, 1}
        r = one("/v1/completions", {"prompt": ["Hello", "Hi there"], "max_tokens": 4})
        assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
        r = one("/completion", {"prompt": ["Hello", "Hi there"], "n_predict": 4})
        assert r.status_code == 200 and len(r.json()) == 2, r.text
        r = one("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})  # the cap itself still holds
        assert r.status_code == 200
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4})
        assert r.status_code == 429, r.text


def test_bad_arguments(llm):
    with pytest.raises(ValueError, match="max_queue"):
        create_app(llm, max_queue=0)
    for key in ("", "  ", 5):  # "": every request refused (--api-key "$UNSET")
        with pytest.raises(ValueError, match="api_key must be a non-empty string"):
            create_app(llm, api_key=key)
    for origins in ([""], "http://x.test"):  # a string: one origin per character
        with pytest.raises(ValueError, match="cors_origins"):
            create_app(llm, cors_origins=origins)


def test_an_unexpected_error_is_counted_as_a_500(llm, monkeypatch):
    from specllm.server import prepare

    def broken(*args, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(prepare, "chat_prompt", broken)
    with TestClient(create_app(llm), raise_server_exceptions=False) as c:
        assert c.post("/v1/chat/completions", json={"messages": MESSAGES}).status_code == 500
        metrics = c.get("/metrics").text
    assert 'specllm_requests_total{endpoint="/v1/chat/completions",status="500"} 1.0' in metrics, metrics


def test_unknown_fields_are_ignored(llm):
    with TestClient(create_app(llm)) as c:
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "user": "me",
                                                 "store": False, "metadata": {"a": "b"}, "frequency_penalty": 0,
                                                 "presence_penalty": 0, "parallel_tool_calls": True,
                                                 "response_format": {"type": "text"}})
        assert r.status_code == 200, r.text


def test_binding_beyond_loopback_without_a_key_warns(llm, monkeypatch, caplog):
    from specllm.server import app as server_app

    class NoServer:  # stands in for uvicorn's server: returns at once
        def __init__(self, config):
            self.config = config

        def run(self, sockets):
            assert sockets and all(s.getsockname()[1] > 0 for s in sockets)  # bound before the run

    monkeypatch.setattr(server_app, "_uvicorn_server", lambda: NoServer)
    with caplog.at_level("WARNING", logger="specllm.server"):
        specllm.serve(llm, host="0.0.0.0", port=0)
    assert any("without an API key" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("ERROR", logger="specllm.server"):  # --log-level error keeps it: the port is open to all
        specllm.serve(llm, host="0.0.0.0", port=0)
    assert [r.levelname for r in caplog.records if "without an API key" in r.getMessage()] == ["ERROR"]
    with caplog.at_level("INFO", logger="specllm.server"):
        specllm.serve(llm, host="127.0.0.1", port=0)
    assert any(re.match(r"listening on http://127\.0\.0\.1:[1-9]\d*", r.getMessage()) for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="specllm.server"):
        specllm.serve(llm, host="127.0.0.1", port=0)
        specllm.serve(llm, host="0.0.0.0", port=0, api_key="k")
    assert not caplog.records
    assert server_app.is_loopback("::1") and server_app.is_loopback("localhost")
    assert not server_app.is_loopback("192.168.1.5")


def test_listen_takes_the_port_now_and_says_what_stands_in_the_way():
    """serve() listens before the load: a second server on the port fails there (bound with SO_REUSEADDR but not
    listening, both would pass), a port out of range is refused (getaddrinfo wrapped 70000 to 4464)."""
    from specllm.server import app as server_app

    first = server_app.listen("127.0.0.1", 0)
    port = first[0].getsockname()[1]
    try:
        assert server_app.url(first[0]) == f"http://127.0.0.1:{port}"
        with pytest.raises(specllm.ListenError, match=f"cannot listen on 127.0.0.1:{port}: .*another program"):
            server_app.listen("127.0.0.1", port)
    finally:
        for sock in first:
            sock.close()
    for port in (70000, -1, True, "80"):
        with pytest.raises(specllm.ListenError, match="port must be an int from 0 to 65535"):
            server_app.listen("127.0.0.1", port)
    with pytest.raises(specllm.ListenError, match="cannot listen on host 'no such host.invalid'"):
        server_app.listen("no such host.invalid", 0)


def test_a_request_after_the_worker_stopped_is_a_503_that_says_why(llm):
    # between the start of a shutdown (the worker is stopped first) and the listening socket's close
    app = create_app(llm)
    with TestClient(app) as c:
        app.state.specllm.worker.stop()
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4})
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "server_shutting_down" and "shutting down" in err["message"]


def test_bodies_and_fields_a_fuzzer_sent_get_errors_that_say_what_to_fix(llm):
    """Each was a 400 in words that did not say what was wrong: FastAPI's "There was an error parsing the body",
    "Field required" without a field, pydantic's union tags ("stop.str"), the schema converter's KeyError, a
    chat template's TypeError."""
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#/$defs/a"}}}
    with TestClient(create_app(llm)) as c:
        for body, words in [(b'{"messages": "\xff"}', "cannot be read as JSON: it must be UTF-8"),
                            (b"[" * 3000 + b"]" * 3000, "nested at most"),
                            (b'{"max_tokens": ' + b"9" * 5000 + b"}", "at most 4300 digits"),
                            (b"", "the request has no body")]:
            r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (body[:40], r.text)
            assert r.json()["error"]["code"] == "invalid_json"
        r = c.post("/api/chat", content=b"")
        assert r.status_code == 400 and "no body" in r.json()["error"], r.text  # Ollama's shape: {"error": text}
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "response_format": schema})
        assert r.status_code == 400 and "$ref '#/$defs/a' points to nothing" in r.text, r.text
        r = c.post("/v1/chat/completions", json={"max_tokens": 2, "messages": [
            {"role": "assistant", "tool_calls": [{}]}, {"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.tool_calls.0.function", r.text
        assert "messages[0].tool_calls[0] needs a function with its name" in r.text
        name = c.get("/v1/models").json()["data"][0]["id"]
        for options, where in [({"stop": 5}, "options.stop"), ({"temperature": "hot"}, "options.temperature")]:
            r = c.post("/api/chat", json={"model": name, "messages": MESSAGES, "options": options, "stream": False})
            error = r.json()["error"]
            assert r.status_code == 400 and error.startswith(where + ":") and ".str" not in error, r.text
        r = c.post("/api/generate", json={"model": name, "prompt": "hi", "format": 5, "stream": False})
        assert r.status_code == 400 and "format" in r.json()["error"], r.text


def test_requests_are_prepared_one_at_a_time_in_order_and_a_stop_ends_the_waiting_ones():
    """jobs.prepared: one thread, first come first served, and each request resumes in that order (so jobs are
    queued as requests came); one still waiting for the thread when the server stops (app.py's lifespan shuts the
    thread down and drops it) is a 503, not a CancelledError."""
    import asyncio
    import time
    from types import SimpleNamespace

    from specllm.server import jobs
    from specllm.server.errors import APIError

    state = SimpleNamespace(lane=None, worker=SimpleNamespace(stopping=False))

    async def connected():
        return False

    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(specllm=state)), is_disconnected=connected)
    started, resumed = threading.Event(), []

    def work(name, seconds):
        started.set()
        time.sleep(seconds)
        return name

    async def one(name, seconds):
        out = await jobs.prepared(request, work, name, seconds)
        resumed.append(out)  # what a handler does next, with no await before its submit
        return out

    async def main():
        tasks = [asyncio.ensure_future(one(n, s)) for n, s in (("a", 0.3), ("b", 0.0), ("c", 0.1))]
        assert await asyncio.gather(*tasks) == ["a", "b", "c"] and resumed == ["a", "b", "c"]
        started.clear()
        first = asyncio.ensure_future(one("first", 0.5))
        second = asyncio.ensure_future(one("second", 0.0))
        await asyncio.to_thread(started.wait, 10)
        state.lane.shutdown(wait=False, cancel_futures=True)  # as the lifespan does
        state.lane = None
        assert await first == "first"
        with pytest.raises(APIError) as e:
            await second
        assert e.value.status == 503 and e.value.code == "server_shutting_down"

    asyncio.run(main())


def test_null_is_not_given_and_numbers_are_not_booleans_or_strings(llm):
    """openai's client sends stream=None as null (a 400: "stream: Input should be a valid boolean"); and pydantic's
    lax mode took "max_tokens": true as 1, "top_k": true as greedy, "temperature": "0.5" as 0.5, where the Python
    API raises TypeError and OpenAI's API refuses them."""
    import openai

    with TestClient(create_app(llm)) as c:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c, max_retries=0)
        want = llm.chat(MESSAGES, max_tokens=8).text
        r = client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=8, stream=None)
        assert r.choices[0].message.content == want
        for path, body in (("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "stream": None,
                                                     "stream_options": None, "temperature": None}),
                           ("/completion", {"prompt": "hello", "n_predict": 4, "stream": None, "n_probs": None,
                                            "n_indent": None, "temperature": 0})):
            assert c.post(path, json=body).status_code == 200, (path, c.post(path, json=body).text)
        for path, body, param in (
                ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": True}, "max_tokens"),
                ("/v1/chat/completions", {"messages": MESSAGES, "temperature": "0.5"}, "temperature"),
                ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5.0}, "max_tokens"),
                ("/v1/chat/completions", {"messages": MESSAGES, "stream": "yes"}, "stream"),
                ("/v1/chat/completions", {"messages": MESSAGES, "draft_length": True}, "draft_length"),
                ("/completion", {"prompt": "hello", "top_k": True}, "top_k"),
                ("/completion", {"prompt": "hello", "n_predict": True}, "n_predict"),
                ("/api/chat", {"model": "target", "messages": MESSAGES, "options": {"top_k": True}}, "top_k")):
            r = c.post(path, json=body)
            assert r.status_code == 400 and param in r.text, (path, body, r.text)


def test_responses_and_messages_take_specllms_own_fields_as_chat_does(llm):
    """grammar, the repetition penalties and logit_bias were dropped without a word on /v1/responses and
    /v1/messages (the README: "specllm's own fields as on chat")."""
    grammar = 'root ::= "yes" | "no"'
    with TestClient(create_app(llm)) as c:
        def texts(extra, n):
            chat = c.post("/v1/chat/completions", json=dict(messages=MESSAGES, max_tokens=n, **extra)).json()
            resp = c.post("/v1/responses", json=dict(input="hello", max_output_tokens=n, **extra)).json()
            msgs = c.post("/v1/messages", json=dict(messages=MESSAGES, max_tokens=n, **extra)).json()
            return [chat["choices"][0]["message"]["content"], resp["output"][0]["content"][0]["text"],
                    msgs["content"][0]["text"]]
        assert all(t in ("yes", "no") for t in texts({"grammar": grammar}, 4))
        free = texts({}, 16)
        want = llm.chat(MESSAGES, max_tokens=16, repeat_penalty=5.0, penalty_last_n=-1).text
        assert want != free[0] and texts({"repeat_penalty": 5.0, "repeat_last_n": -1}, 16) == [want] * 3
        first = llm.chat(MESSAGES, max_tokens=16).tokens[0]
        banned = llm.chat(MESSAGES, max_tokens=16, logit_bias={first: float("-inf")}).text
        assert texts({"logit_bias": {str(first): -100}}, 16) == [banned] * 3


def test_seed_minus_1_is_a_fresh_seed_as_on_llama_servers_endpoints(llm):
    """-1 was the fixed seed 2^64 - 1 on /v1/* (a fresh one on /completion, Ollama and the CLI, as llama-server)."""
    with TestClient(create_app(llm)) as c:
        def text(seed):
            body = {"messages": MESSAGES, "max_tokens": 16, "temperature": 1.5, "seed": seed}
            return c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        assert text(2**64 - 1) == text(2**64 - 1)
        assert len({text(-1) for _ in range(3)}) > 1


def test_specllm_server_is_there_after_import_specllm_and_a_call_names_an_unknown_template(llm):
    """README: `specllm.server.create_app(llm)` after `import specllm` was an AttributeError (the subpackage was
    imported only by serve()); apply_chat_template(chat_template="nosuchformat") blamed the model's own template."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import specllm, sys; assert 'fastapi' not in sys.modules; "
                        "print(specllm.server.create_app.__name__)"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "create_app", r.stderr[-800:]
    with pytest.raises(specllm.InvalidOptionError, match="neither a Jinja template nor one of llama.cpp's built-in"):
        llm.apply_chat_template(MESSAGES, chat_template="nosuchformat")
