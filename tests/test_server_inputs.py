"""Requests as clients send them that the server once mishandled: a JSON body without a JSON Content-Type (curl -d,
as Ollama's README writes it), lone surrogates ("\\ud800" escapes) in a raw prompt, in echoed fields of a streamed
reply and in a streamed tool call's arguments. A real `specllm-cli serve` of the tiny tools model (tools_server)."""

import json

import httpx
import pytest

TIMEOUT = 60
MODEL = "tiny-tools"
# a call whose argument the model must write as the JSON escape "\ud800" (a lone surrogate once decoded), as a model
# may write half of an emoji's pair
SURROGATE_TOOL = {"type": "function", "function": {"name": "echo", "parameters": {
    "type": "object", "properties": {"p": {"type": "string", "pattern": "^\\\\ud800$"}}, "required": ["p"],
    "additionalProperties": False}}}


def as_json(obj, **headers) -> dict:
    """httpx keyword arguments for a JSON body with \\u escapes (httpx's json= writes UTF-8, which has no form for a
    lone surrogate), as JSON.stringify and Python's json module send it."""
    return {"content": json.dumps(obj).encode(), "headers": {"content-type": "application/json", **headers}}


@pytest.fixture(scope="module")
def server(tools_server):
    return tools_server


@pytest.mark.parametrize("path, body", [
    ("/api/generate", {"model": MODEL, "prompt": "Why is the sky blue?", "stream": False, "options": {"num_predict": 4}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/tokenize", {"content": "hello"})])
@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_json_body_is_read_as_json_whatever_its_content_type_says(server, path, body, content_type):
    """`curl URL -d '{...}'` sends application/x-www-form-urlencoded; llama-server and Ollama read the body as JSON
    anyway, and FastAPI answered 400 "Input should be a valid dictionary"."""
    headers = {"content-type": content_type} if content_type else {}
    r = httpx.post(server.url + path, content=json.dumps(body).encode(), headers=headers, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json()
    # a body that is not JSON says so
    r = httpx.post(server.url + path, content=b"model=x&prompt=y", headers=headers, timeout=TIMEOUT)
    assert r.status_code in (400, 422) and "JSON" in r.text, r.text


def test_a_browsers_request_keeps_its_content_type(server):
    """A page's text/plain POST (one that skips CORS's preflight) is not read as JSON: only clients that are not
    browsers (no Origin header) get the lenient reading."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    r = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=TIMEOUT,
                   headers={"content-type": "text/plain", "origin": "http://example.com"})
    assert r.status_code == 400, r.text


def test_a_raw_prompt_with_a_lone_surrogate_is_a_400(server):
    r = httpx.post(server.url + "/api/generate", timeout=TIMEOUT,
                   **as_json({"model": MODEL, "prompt": "a\ud800", "raw": True, "stream": False}))
    assert r.status_code == 400 and "error" in r.json(), r.text
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200


def sse_data(response) -> list:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


def test_a_streamed_reply_echoing_a_lone_surrogate_is_whole(server):
    """/v1/responses echoes metadata in its events; "\\ud800" has no UTF-8 form, and the stream was cut off."""
    with httpx.stream("POST", server.url + "/v1/responses", timeout=TIMEOUT, **as_json({
            "model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 4, "metadata": {"k": "\ud800"}})) as r:
        events = sse_data(r)
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]  # the last event came
    assert events[-1]["response"]["metadata"] == {"k": "\ud800"}


def test_a_streamed_tool_call_with_a_lone_surrogate_in_its_arguments_is_whole(server):
    """A forced call whose argument is "\\ud800": the arguments were written back with the raw surrogate and the
    stream broke off after its headers, on chat completions, messages and responses alike."""
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=TIMEOUT, **as_json({
            "model": MODEL, "messages": [{"role": "user", "content": "go"}], "tools": [SURROGATE_TOOL],
            "tool_choice": "required", "stream": True, "max_tokens": 40})) as r:
        chunks = sse_data(r)
    args = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments") or "" for c in chunks
                   if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
    assert json.loads(args) == {"p": "\ud800"} and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    with httpx.stream("POST", server.url + "/v1/messages", timeout=TIMEOUT, **as_json(
            {"model": MODEL, "max_tokens": 40, "stream": True, "tool_choice": {"type": "any"},
             "messages": [{"role": "user", "content": "go"}],
             "tools": [{"name": "echo", "input_schema": SURROGATE_TOOL["function"]["parameters"]}]},
            **{"anthropic-version": "2023-06-01"})) as r:
        events = sse_data(r)
    partial = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    assert json.loads(partial) == {"p": "\ud800"} and events[-1]["type"] == "message_stop"
    with httpx.stream("POST", server.url + "/v1/responses", timeout=TIMEOUT, **as_json({
            "model": MODEL, "input": "go", "stream": True, "max_output_tokens": 40, "tool_choice": "required",
            "tools": [dict(SURROGATE_TOOL["function"], type="function")]})) as r:
        events = sse_data(r)
    call = [o for o in events[-1]["response"]["output"] if o["type"] == "function_call"]
    assert events[-1]["type"] == "response.completed" and json.loads(call[0]["arguments"]) == {"p": "\ud800"}
