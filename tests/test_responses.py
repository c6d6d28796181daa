"""POST /v1/responses (OpenAI's Responses API, which agents call) on a real `specllm-cli serve`, driven by the
official `openai` client and its stream helper: the reply is the chat reply of the same conversation, a tool call
is a function_call item, a call and its output in `input` go back into the prompt as the chat's tool_calls and tool
message do, and what cannot be served is a 400 that names the field. The tiny model has a Hermes-style template
(models/tiny.py "tools"); the draft is the tiny draft model with n-gram lookup (the default configuration)."""

import json

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                          "required": ["city"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(tools_server):
    return tools_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(tools_local):
    return tools_local


def test_a_reply_is_the_chat_reply_of_the_same_conversation(client, local):
    r = client.responses.create(model="tiny-tools", instructions="You are terse.", input=ASK, max_output_tokens=24)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": ASK}]
    want = local.chat(messages, max_tokens=24)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny-tools"
    assert r.output_text == want.text and len(r.output) == 1
    item = r.output[0]
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text" and item.content[0].text == want.text
    # cut by max_output_tokens: incomplete, as OpenAI says it
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == want.stats.n_prompt and r.usage.output_tokens == 24
    assert r.usage.total_tokens == r.usage.input_tokens + 24 and r.instructions == "You are terse."
    # the whole body under the client's own types, strictly (usage.input_tokens_details.cache_write_tokens was
    # missing, which they declare required)
    from openai.types.responses import Response
    Response.model_validate(r.model_dump(mode="json", exclude_unset=True), strict=True)
    assert r.model_extra["speculative"]["steps"] <= 24
    chat = client.chat.completions.create(model="tiny-tools", messages=messages, max_tokens=24)
    assert chat.choices[0].message.content == r.output_text
    # input as a list of items, the text in parts (joined with a line break, as llama-server joins them)
    parts = [{"type": "input_text", "text": "You are"}, {"type": "input_text", "text": "terse."}]
    r2 = client.responses.create(model="tiny-tools", input=[{"role": "developer", "content": parts},
                                                           {"type": "message", "role": "user", "content": ASK}],
                                 max_output_tokens=24)
    joined = local.chat([{"role": "system", "content": "You are\nterse."}, {"role": "user", "content": ASK}],
                        max_tokens=24)
    assert r2.output_text == joined.text and r2.usage.input_tokens == joined.stats.n_prompt
    count = client.responses.input_tokens.count(model="tiny-tools", instructions="You are terse.", input=ASK)
    assert count.object == "response.input_tokens" and count.input_tokens == want.stats.n_prompt


def test_a_streamed_reply_gives_the_events_in_order_and_the_same_text(client, local):
    events = list(client.responses.create(model="tiny-tools", input=ASK, max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    want = local.chat([{"role": "user", "content": ASK}], max_tokens=24).text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    last = events[-1].response
    assert last.status == "incomplete" and last.output[0].content[0].text == want and last.usage.output_tokens == 24
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1


SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def test_text_format_is_the_chats_response_format(client):
    fmt = {"format": {"type": "json_schema", "name": "pick", "schema": SCHEMA, "strict": True}}
    r = client.responses.create(model="tiny-tools", input="Pick a colour.", text=fmt, max_output_tokens=40)
    assert r.status == "completed" and json.loads(r.output_text)["colour"] in ("red", "green", "blue")
    chat = client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "Pick a colour."}],
                                          max_tokens=40, response_format={"type": "json_schema", "json_schema": {
                                              "name": "pick", "schema": SCHEMA, "strict": True}})
    assert chat.choices[0].message.content == r.output_text
    with client.responses.stream(model="tiny-tools", input="Pick a colour.", text=fmt, max_output_tokens=40) as stream:
        final = stream.get_final_response()  # the SDK's helper accumulates the events into the same Response
    assert final.output_text == r.output_text and final.status == "completed"


def test_a_forced_call_is_a_function_call_item(client):
    r = client.responses.create(model="tiny-tools", input=ASK, tools=[WEATHER], max_output_tokens=40,
                                tool_choice={"type": "function", "name": "get_weather"})
    assert r.status == "completed" and [i.type for i in r.output] == ["function_call"], r.output
    call = r.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
    assert r.tools[0].name == "get_weather" and r.tool_choice.name == "get_weather"
    chat = client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": ASK}],
                                          tools=[CHAT_WEATHER], max_tokens=40,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert chat.choices[0].message.tool_calls[0].function.arguments == call.arguments
    # streamed, through the SDK's helper: the call's events, and the same call in the final Response
    with client.responses.stream(model="tiny-tools", input=ASK, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=40) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-5:] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert "response.output_text.delta" not in kinds
    assert [(i.type, i.name, i.arguments) for i in final.output] == [("function_call", "get_weather", call.arguments)]


def test_a_call_and_its_output_in_input_are_the_chats_tool_calls_and_tool_message(client, local):
    items = [{"role": "user", "content": ASK},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "rain"}'},
             {"type": "reasoning", "id": "rs_1", "summary": []}]  # an agent's reasoning item: not in the prompt
    r = client.responses.create(model="tiny-tools", input=items, tools=[WEATHER], max_output_tokens=16)
    messages = [{"role": "user", "content": ASK},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "rain"}'}]
    prompt = local.apply_chat_template(messages, tools=[CHAT_WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n{\"sky\": \"rain\"}" in prompt
    # the same prompt (the reply itself may differ from a fresh plain decoding of it: the server read the prompt's
    # start from its KV cache, computed in other batches, and a near-tie of the random tiny model can flip)
    assert r.usage.input_tokens == len(local.prompt_tokens(prompt)) and r.output[0].type == "message"


def test_previous_response_id_goes_on_from_a_kept_response(client, local):
    r1 = client.responses.create(model="tiny-tools", instructions="Be brief.", input=ASK, max_output_tokens=8)
    assert r1.store is True and client.responses.retrieve(r1.id).output_text == r1.output_text
    r2 = client.responses.create(model="tiny-tools", previous_response_id=r1.id, input="And in Oslo?",
                                 max_output_tokens=8)
    conversation = [{"role": "user", "content": ASK}, {"role": "assistant", "content": r1.output_text},
                    {"role": "user", "content": "And in Oslo?"}]  # the instructions are not carried over
    assert r2.previous_response_id == r1.id
    assert r2.usage.input_tokens == len(local.prompt_tokens(local.apply_chat_template(conversation)))
    assert r2.usage.input_tokens_details.cached_tokens > 0  # the KV cache of r1's prompt
    # a forced call, then its output sent with the call's response as the previous one
    r3 = client.responses.create(model="tiny-tools", input=ASK, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=40)
    call = r3.output[0]
    r4 = client.responses.create(model="tiny-tools", previous_response_id=r3.id, tools=[WEATHER],
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
                                 max_output_tokens=8)
    calls = [{"id": call.call_id, "type": "function", "function": {"name": call.name,
                                                                    "arguments": json.loads(call.arguments)}}]
    prompt = local.apply_chat_template([{"role": "user", "content": ASK},
                                        {"role": "assistant", "content": None, "tool_calls": calls},
                                        {"role": "tool", "content": "rain"}], tools=[CHAT_WEATHER])
    assert r4.usage.input_tokens == len(local.prompt_tokens(prompt))
    # store: false keeps nothing; DELETE drops a kept one
    r5 = client.responses.create(model="tiny-tools", input=ASK, max_output_tokens=2, store=False)
    assert r5.store is False
    for rid in (r5.id, "resp_nothing"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)
    assert client.responses.delete(r1.id) is None
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="tiny-tools", previous_response_id=r1.id, input="x", max_output_tokens=2)
    assert e.value.body["param"] == "previous_response_id" and "earlier items in input" in e.value.body["message"]
    # streamed responses are kept too
    events = list(client.responses.create(model="tiny-tools", input=ASK, max_output_tokens=4, stream=True))
    kept = client.responses.retrieve(events[-1].response.id)
    assert kept.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_the_store_keeps_the_newest():
    from specllm.server.response_store import ResponseStore

    store = ResponseStore(max_responses=2)
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": str(i)}], {"id": f"r{i}", "output": []}, [{"id": f"m{i}"}])
    assert store.context("r0") is None and store.body("r2")["id"] == "r2" and len(store) == 2
    assert store.item("m0") is None and store.item("m1") == {"id": "m1"}
    store.context("r1")[0][0]["content"] = "changed"  # a copy: the kept one stays
    store.input_items("r1")[0]["id"] = "changed"
    assert store.context("r1") == ([{"role": "user", "content": "1"}], [{"id": "m1"}])
    assert store.input_items("r1") == [{"id": "m1"}]
    store.put("r3", [], {"output": []}, [])  # r2 is now the least recently used (r1 was read)
    assert store.body("r2") is None and store.body("r1") is not None


def test_input_items_lists_a_chains_items_and_an_item_reference_names_a_kept_one(client, server, local):
    r1 = client.responses.create(model="tiny-tools", input=ASK, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=40)
    call = r1.output[0]
    r2 = client.responses.create(model="tiny-tools", previous_response_id=r1.id, tools=[WEATHER],
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
                                 max_output_tokens=4)
    # newest first by default: r2's own input, then r1's output (the call), then r1's input (the question)
    page = client.responses.input_items.list(r2.id)
    assert [i.type for i in page.data] == ["function_call_output", "function_call", "message"]
    assert page.data[1].id == call.id and page.data[1].call_id == call.call_id
    assert page.data[2].role == "user" and page.data[2].content[0].type == "input_text"
    assert page.data[2].content[0].text == ASK and page.data[2].id.startswith("msg_") and not page.has_more
    assert page.data[0].output == "rain" and page.first_id == page.data[0].id and page.last_id == page.data[2].id
    asc = client.responses.input_items.list(r2.id, order="asc", limit=2)
    assert [i.id for i in asc.data] == [page.data[2].id, call.id] and asc.has_more
    rest = client.responses.input_items.list(r2.id, order="asc", after=call.id)
    assert [i.id for i in rest.data] == [page.data[0].id] and not rest.has_more
    # the SDK's pager follows has_more / last_id through them all
    assert [i.id for i in client.responses.input_items.list(r2.id, order="asc", limit=1)] == \
        [i.id for i in reversed(page.data)]
    # the call named by its id (as Codex resends earlier items): the same prompt as the call itself sent
    by_ref = client.responses.create(model="tiny-tools", tools=[WEATHER], max_output_tokens=2, input=[
        {"role": "user", "content": ASK}, {"type": "item_reference", "id": call.id},
        {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}])
    assert by_ref.usage.input_tokens == r2.usage.input_tokens
    referred = client.responses.input_items.list(by_ref.id, order="asc")
    assert [i.type for i in referred.data] == ["message", "function_call", "function_call_output"]
    assert referred.data[1].id == call.id  # listed as the item it names
    for query, param in [({"order": "up"}, "order"), ({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                         ({"limit": "x"}, "limit"), ({"after": "msg_nothing"}, "after")]:
        r = httpx.get(f"{server.url}/v1/responses/{r2.id}/input_items", params=query, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    with pytest.raises(openai.BadRequestError) as e:  # the call again beside the response that holds it
        client.responses.create(model="tiny-tools", previous_response_id=r1.id, max_output_tokens=2,
                                input=[{"type": "item_reference", "id": call.id}])
    assert e.value.body["param"] == "input.0" and e.value.body["code"] == "duplicate_item"
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nothing")
    with pytest.raises(openai.BadRequestError) as e:  # a reference to nothing kept
        client.responses.create(model="tiny-tools", input=[{"type": "item_reference", "id": "fc_nothing"}],
                                max_output_tokens=2)
    assert e.value.body["param"] == "input.0.id" and "send the item itself" in e.value.body["message"]


def test_hosted_tools_are_not_offered_and_not_echoed(client, local):
    r = client.responses.create(model="tiny-tools", input=ASK, tools=[{"type": "web_search"}], max_output_tokens=8)
    assert r.tools == [] and r.output_text == local.chat([{"role": "user", "content": ASK}], max_tokens=8).text


BAD = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "earlier items in input"),  # a 404
    ({"conversation": "conv_1"}, "conversation", "keeps no conversations"),
    ({"background": True}, "background", "background"),
    ({"top_logprobs": 2}, "top_logprobs", "/v1/chat/completions"),
    ({"include": ["message.output_text.logprobs"]}, "include", "logprobs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input.0.content.0.type", "only text"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input.0.content.0", "text part"),
    ({"input": [{"role": "user", "content": 3}]}, "input.0.content", "string or a list"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", "'user', 'system'"),
    ({"input": [{"content": "x"}]}, "input.0.role", "without a role"),
    ({"input": ["x"]}, "input", None),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
     "input.0.output.0.type", "input[0].output[0] is of type 'input_image'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.id", "not kept here"),
    ({"input": [{"type": "item_reference"}]}, "input.0.id", "not kept here"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type", "'web_search_call' is not supported"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id", "call_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id", "call_id"),
    ({"input": []}, "input", "at least one item"),
    ({"input": None}, "input", None),
    ({"tools": [{"type": "function", "parameters": {}}]}, "tools.0.name", "needs a name"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice", "tool_choice must be"),
    ({"tool_choice": "required"}, "tool_choice", "no tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "not among"),
    ({"text": {"format": {"type": "xml"}}}, "text.format", None),
    ({"text": {"format": "json"}}, "text.format", "text.format must be an object"),
    ({"max_output_tokens": 0}, "max_output_tokens", None),
    ({"max_output_tokens": 5000}, "input", "lower max_output_tokens"),
    ({"temperature": -1}, "temperature", None),
    ({"temperature": 9}, "temperature", None),  # OpenAI's range is 0-2
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs its schema"),
    ({"truncation": "bogus"}, "truncation", None),
    ({"model": "gpt-4o"}, "model", "does not exist"),
]


@pytest.mark.parametrize("fields,param,words", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_what_cannot_be_served_is_a_400_naming_the_field(server, fields, param, words):
    body = {"input": ASK, "max_output_tokens": 4, **fields}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
    want = 404 if param in ("model", "previous_response_id") else 400
    assert r.status_code == want, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert words is None or words in err["message"], err
    assert "Traceback" not in r.text
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_client_that_leaves_mid_stream_stops_the_generation(server, client):
    before = server.metric("specllm_requests_cancelled_total", stage="running")
    generated = server.metric("specllm_cancelled_generated_tokens_total")
    with httpx.stream("POST", f"{server.url}/v1/responses", timeout=30,
                      json={"input": ASK, "max_output_tokens": 1500, "stream": True}) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 6:
                break  # leaving the block closes the connection
    assert server.wait_metric("specllm_requests_cancelled_total", before + 1, stage="running") == before + 1
    assert 0 < server.metric("specllm_cancelled_generated_tokens_total") - generated < 500
    assert client.responses.create(model="tiny-tools", input=ASK, max_output_tokens=4).status == "incomplete"


def test_a_generation_error_midway_is_an_error_event_and_a_failed_response(tiny_tools, make_llm):
    from test_server_app import failing_stream

    from specllm.server import create_app

    llm = make_llm(tiny_tools)
    with TestClient(create_app(llm)) as c:
        restore = failing_stream(llm, after=2)
        r = c.post("/v1/responses", json={"input": ASK, "max_output_tokens": 20})
        assert r.status_code == 500 and "llama_decode failed" in r.json()["error"]["message"]
        with c.stream("POST", "/v1/responses", json={"input": ASK, "max_output_tokens": 20, "stream": True}) as s:
            data = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        restore()
        assert [d["type"] for d in data[-2:]] == ["error", "response.failed"]
        assert "llama_decode failed" in data[-2]["message"] and data[-1]["response"]["status"] == "failed"
        assert c.post("/v1/responses", json={"input": ASK, "max_output_tokens": 4}).status_code == 200
