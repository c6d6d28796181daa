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
    "type": "object", "properties": {"p": {"const": "\ud800"}}, "required": ["p"],
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


@pytest.fixture(scope="module")
def local(tools_local):
    return tools_local


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"],
    "additionalProperties": False}}}


def test_a_reply_begun_in_the_last_assistant_message_is_continued(server, local):
    """Anthropic's prefill, which llama-server continues too: the server closed the begun reply as a turn and
    answered anew (`{"a":` then `{"a": 1}`)."""
    begun = "The weather in Paris is"
    messages = ASK + [{"role": "assistant", "content": begun}]
    prompt = local.apply_chat_template(ASK) + begun
    want = local.generate(prompt, max_tokens=8).text
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT,
                      json={"model": MODEL, "messages": messages, "max_tokens": 8}).json()
    assert chat["choices"][0]["message"]["content"] == want
    assert chat["usage"]["prompt_tokens"] == len(local.prompt_tokens(prompt))
    anthropic = httpx.post(server.url + "/v1/messages", timeout=TIMEOUT,
                           json={"model": MODEL, "messages": messages, "max_tokens": 8}).json()
    assert anthropic["content"][0]["text"] == want
    for extra in ({"tools": [WEATHER], "tool_choice": "required"}, {"response_format": {"type": "json_object"}}):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT,
                       json={"model": MODEL, "messages": messages, "max_tokens": 8, **extra})
        assert r.status_code == 400 and "begun in the last" in r.json()["error"]["message"], r.text
    # a begun reply kept by /v1/responses is one turn: the next request's conversation has it whole
    first = httpx.post(server.url + "/v1/responses", timeout=TIMEOUT, json={
        "model": MODEL, "input": messages, "max_output_tokens": 8}).json()
    assert first["output"][0]["content"][0]["text"] == want
    after = httpx.post(server.url + "/v1/responses/input_tokens", timeout=TIMEOUT, json={
        "model": MODEL, "input": "more", "previous_response_id": first["id"]}).json()
    whole = ASK + [{"role": "assistant", "content": begun + want}, {"role": "user", "content": "more"}]
    assert after["input_tokens"] == len(local.prompt_tokens(local.apply_chat_template(whole)))
    # an assistant message alone is the conversation, not a reply begun (it was a 400 "messages must be non-empty")
    alone = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, json={
        "model": MODEL, "messages": [{"role": "assistant", "content": "Hello"}], "max_tokens": 2})
    assert alone.status_code == 200, alone.text
    # an assistant message with calls ends its turn as before
    closed = ASK + [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}]
    opening = local.apply_chat_template(ASK)[len(local.apply_chat_template(ASK, add_generation_prompt=False)):]
    r = httpx.post(server.url + "/apply-template", json={"messages": closed}, timeout=TIMEOUT)
    assert r.json()["prompt"].endswith(opening) and r.json()["prompt"] != local.apply_chat_template(ASK)
    # one with nothing is a reply begun with nothing: the reply from its start, as llama-server continues it (it was
    # an empty turn, then a new one)
    r = httpx.post(server.url + "/apply-template", json={"messages": ASK + [{"role": "assistant", "content": ""}]},
                   timeout=TIMEOUT)
    assert r.json()["prompt"] == local.apply_chat_template(ASK)


def test_token_counts_of_prompts_longer_than_the_context(server):
    # the count is what a client asks to learn whether a prompt fits: it was a 400 context_length_exceeded
    long = " ".join(f"w{i}" for i in range(3000))  # well past the tiny server's 2048 tokens
    r = httpx.post(server.url + "/v1/messages/count_tokens", timeout=TIMEOUT,
                   json={"model": MODEL, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 2048, r.text
    r = httpx.post(server.url + "/v1/responses/input_tokens", timeout=TIMEOUT, json={"model": MODEL, "input": long})
    assert r.status_code == 200 and r.json()["input_tokens"] > 2048, r.text
    r = httpx.post(server.url + "/v1/messages/count_tokens", timeout=TIMEOUT,  # max_tokens is not counted
                   json={"model": MODEL, "max_tokens": 8000, "messages": ASK})
    assert r.status_code == 200 and 0 < r.json()["input_tokens"] < 100, r.text
    r = httpx.post(server.url + "/v1/messages", timeout=TIMEOUT,  # generating it is still a 400
                   json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_streamed_call_ends_its_arguments_in_the_openai_clients_stream_helper(server):
    # the call and finish_reason "tool_calls" came in one chunk: the helper read the finish first and never said
    # tool_calls.function.arguments.done; OpenAI and llama-server end with a chunk of an empty delta
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                        max_tokens=40) as s:
        kinds = [e.type for e in s]
        final = s.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds, kinds
    assert final.choices[0].finish_reason == "tool_calls"
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments).keys() == {"city"}
    # a call-only reply has no content, streamed as whole (the first chunk's content "" made it '' in the helper)
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=40)
    assert whole.choices[0].message.content is None and final.choices[0].message.content is None


def test_a_tool_schema_nested_hundreds_of_levels_deep_is_not_a_server_error(server):
    # copy.deepcopy of a schema ~300 levels deep raised RecursionError outside the converter's fallback: a 500 (and a
    # 6000-line traceback) on all four; its arguments are any JSON object now, as for any schema it cannot express
    schema = '{"type": "object", "properties": {"a": ' * 400 + '{"type": "string"}' + '}}' * 400
    user = '"messages": [{"role": "user", "content": "hi"}]'
    bodies = {"/v1/messages": '{"max_tokens": 2, %s, "tools": [{"name": "f", "input_schema": %s}]}' % (user, schema),
              "/v1/messages/count_tokens": '{%s, "tools": [{"name": "f", "input_schema": %s}]}' % (user, schema),
              "/v1/responses": '{"max_output_tokens": 2, "input": "hi", "tools": [{"type": "function", "name": "f", '
                               '"parameters": %s}]}' % schema,
              "/v1/chat/completions": '{"max_tokens": 2, %s, "tools": [{"type": "function", "function": {"name": '
                                      '"f", "parameters": %s}}]}' % (user, schema)}
    for path, body in bodies.items():  # the tools in the prompt are longer than the tiny context: a 400, or counted
        r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == (200 if "count" in path else 400), (path, r.status_code, r.text[:300])
        assert "context" in r.text or "count" in path, (path, r.text[:300])


@pytest.mark.parametrize("metadata, words", [({f"k{i}": "v" for i in range(17)}, "at most 16"),
                                             ({"k" * 65: "v"}, "at most 64"), ({"k": "v" * 513}, "at most 512"),
                                             ({"k": 5}, "must be a string")])
def test_responses_metadata_beyond_openais_bounds_is_refused(server, metadata, words):
    # a kept response holds its metadata: 20 requests of 4 MB each grew the server by 92 MB
    r = httpx.post(server.url + "/v1/responses", timeout=TIMEOUT,
                   json={"model": MODEL, "input": "hi", "max_output_tokens": 2, "metadata": metadata})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/v1/responses", timeout=TIMEOUT,
                   json={"model": MODEL, "input": "hi", "max_output_tokens": 2, "truncation": "bogus"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation", r.text


def test_responses_truncation_auto_leaves_out_the_oldest_items(server, local):
    # "auto" was echoed and not applied: a long conversation was a 400 as with "disabled"
    words = " ".join(f"w{i}" for i in range(400))
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {words}"} for i in range(9)]
    body = {"model": MODEL, "input": items, "instructions": "Be brief.", "max_output_tokens": 4}
    r = httpx.post(server.url + "/v1/responses", json=dict(body, truncation="disabled"), timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    r = httpx.post(server.url + "/v1/responses", json=dict(body, truncation="auto"), timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["truncation"] == "auto", r.text
    used = r.json()["usage"]["input_tokens"]
    # the longest tail that fits: the instructions kept, then items from a user turn on, the last always
    fits = [i for i in range(0, 9, 2) if len(local.prompt_tokens(local.apply_chat_template(
        [{"role": "system", "content": "Be brief."}] + items[i:]))) + 4 <= 2048]
    assert used == len(local.prompt_tokens(local.apply_chat_template(
        [{"role": "system", "content": "Be brief."}] + items[fits[0]:]))), used
    alone = [{"role": "user", "content": words * 6}]  # the last item alone is too long: still the 400
    r = httpx.post(server.url + "/v1/responses", json=dict(body, input=alone, truncation="auto"), timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


COLOUR = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}
WEATHER_FLAT = {"type": "function", **WEATHER["function"]}
ANTHROPIC_WEATHER = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
FORMAT_AND_TOOLS = {  # each API's structured output beside its tools, and how its answer says which it gave
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOUR}}},
                             lambda r: (r["choices"][0]["message"]["content"], r["choices"][0]["message"].get("tool_calls"),
                                        r["choices"][0]["finish_reason"])),
    "/v1/responses": ({"input": "hi", "tools": [WEATHER_FLAT],
                       "text": {"format": {"type": "json_schema", "name": "c", "schema": COLOUR}}},
                      lambda r: (r["output"][-1]["content"][0]["text"] if r["output"][-1]["type"] == "message"
                                 else None, [o for o in r["output"] if o["type"] == "function_call"], r["status"])),
    "/v1/messages": ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [ANTHROPIC_WEATHER],
                      "output_config": {"format": {"type": "json_schema", "schema": COLOUR}}},
                     lambda r: ("".join(b["text"] for b in r["content"] if b["type"] == "text") or None,
                                [b for b in r["content"] if b["type"] == "tool_use"], r["stop_reason"])),
    "/api/chat": ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                   "format": COLOUR, "stream": False},
                  lambda r: (r["message"]["content"] or None, r["message"].get("tool_calls"), r["done_reason"])),
}


@pytest.mark.parametrize("path", list(FORMAT_AND_TOOLS))
def test_structured_output_beside_tools_is_a_call_or_that_json(server, path):
    """A JSON format with tools was a 400 on every API ("cannot be combined with tools"): the OpenAI Agents SDK sends
    both on every turn of an agent with an output type. The reply is now a call of one of the tools or JSON of the
    format (this random model writes calls here; test_server_tools.py makes it write both)."""
    body, read = FORMAT_AND_TOOLS[path]
    kinds = set()
    for seed in range(8):
        fields = {"options": {"seed": seed, "temperature": 1.0, "num_predict": 120}} if path == "/api/chat" else {
            "seed": seed, "temperature": 1.0, ("max_output_tokens" if "responses" in path else "max_tokens"): 120}
        r = httpx.post(server.url + path, json={**body, **fields}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        text, calls, end = read(r.json())
        if end in ("length", "incomplete", "max_tokens"):
            continue  # cut: neither form whole
        if calls:
            kinds.add("call")
        else:
            assert set(json.loads(text)) == {"colour"}, (path, text)
            kinds.add("json")
    assert kinds, path  # at least one whole answer
