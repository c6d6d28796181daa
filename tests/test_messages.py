"""POST /v1/messages (Anthropic's Messages API) on a real `specllm-cli serve`, driven by the official `anthropic`
client and its stream helper: the reply is the chat reply of the same conversation, a stop sequence is named, a tool
call is a tool_use block, tool_use and tool_result blocks go back into the prompt as the chat's tool_calls and tool
messages do, count_tokens counts that prompt, and errors have Anthropic's shape. The tiny model has a Hermes-style
template (models/tiny.py "tools") and the slow tiny model's shape; the draft is the tiny draft model with n-gram
lookup (the default configuration)."""


import anthropic
import httpx
import pytest
from fastapi.testclient import TestClient

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                            "required": ["city"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
ASK = "What is the weather in Paris?"
MODEL = "tiny-tools"


@pytest.fixture(scope="module")
def server(tools_server):
    return tools_server


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(tools_local):
    return tools_local


def test_a_reply_is_the_chat_reply_of_the_same_conversation(client, local):
    r = client.messages.create(model=MODEL, max_tokens=24, system="You are terse.",
                               messages=[{"role": "user", "content": ASK}])
    want = local.chat([{"role": "system", "content": "You are terse."}, {"role": "user", "content": ASK}],
                      max_tokens=24)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == MODEL
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want.text
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == want.stats.n_prompt
    assert r.usage.output_tokens == 24 and r.model_extra["speculative"]["steps"] <= 24
    # the system prompt and the message as text blocks: the same prompt, now read from the cache
    again = client.messages.create(model=MODEL, max_tokens=24, system=[{"type": "text", "text": "You are terse."}],
                                   messages=[{"role": "user", "content": [{"type": "text", "text": ASK}]}])
    assert again.content[0].text == want.text and again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == want.stats.n_prompt
    assert client.messages.count_tokens(model=MODEL, system="You are terse.", messages=[
        {"role": "user", "content": ASK}]).input_tokens == want.stats.n_prompt


def test_the_clients_models_list_reads_this_model(client):
    """/v1/models answered OpenAI's objects only: the anthropic client's ModelInfo had no type, display_name or
    created_at (None where it declares them required), and the page no has_more or last_id."""
    page = client.models.list()
    (info,) = [m for m in page.data if m.id == MODEL]
    assert info.type == "model" and info.display_name == MODEL and info.created_at is not None
    assert page.has_more is False and page.last_id == page.data[-1].id


def test_a_streamed_reply_through_the_clients_helper(client, local):
    want = local.chat([{"role": "user", "content": ASK}], max_tokens=24).text
    with client.messages.stream(model=MODEL, max_tokens=24, messages=[{"role": "user", "content": ASK}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == want and final.content[0].text == want and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 24
    events = [e.type for e in client.messages.create(model=MODEL, max_tokens=8, stream=True,
                                                     messages=[{"role": "user", "content": ASK}])]
    assert events[:2] == ["message_start", "content_block_start"] and set(events[2:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_a_stop_sequence_is_named(client, local):
    want = local.chat([{"role": "user", "content": ASK}], max_tokens=24).text
    stop = want[10:12]
    cut = want[:want.index(stop)]
    r = client.messages.create(model=MODEL, max_tokens=24, stop_sequences=["never here", stop],
                               messages=[{"role": "user", "content": ASK}])
    assert r.content[0].text == cut and r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    with client.messages.stream(model=MODEL, max_tokens=24, stop_sequences=[stop],
                                messages=[{"role": "user", "content": ASK}]) as s:
        final = s.get_final_message()
    assert final.content[0].text == cut and final.stop_sequence == stop


def test_a_forced_call_is_a_tool_use_block(client):
    r = client.messages.create(model=MODEL, max_tokens=40, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"},
                               messages=[{"role": "user", "content": ASK}])
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"], r.content
    call = r.content[0]
    assert call.name == "get_weather" and call.input["city"] in ("Paris", "Oslo") and call.id.startswith("toolu_")
    with client.messages.stream(model=MODEL, max_tokens=40, tools=[WEATHER], tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": ASK}]) as s:
        final = s.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [("tool_use", "get_weather", call.input)]
    assert final.stop_reason == "tool_use"


def test_tool_use_and_tool_result_blocks_are_the_chats_tool_calls_and_tool_message(client, local):
    conversation = [{"role": "user", "content": ASK},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "...", "signature": "x"},  # not part of the prompt
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1",
                         "content": [{"type": "text", "text": "rain"}]},
                        {"type": "text", "text": "And tomorrow?"}]}]
    r = client.messages.create(model=MODEL, max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"},
                               messages=conversation)
    chat = [{"role": "user", "content": ASK},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                                   "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
            {"role": "user", "content": "And tomorrow?"}]
    # tool_choice none: the tools are still in the prompt (as llama-server renders them), no call is parsed
    prompt = local.apply_chat_template(chat, tools=[CHAT_WEATHER])
    assert 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    # the same prompt (the reply itself may differ from a fresh plain decoding of it: the server read the prompt's
    # start from its KV cache, computed in other batches, and a near-tie of the random tiny model can flip)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == len(local.prompt_tokens(prompt))
    assert client.messages.count_tokens(model=MODEL, tools=[WEATHER], tool_choice={"type": "none"},
                                        messages=conversation).input_tokens == len(local.prompt_tokens(prompt))


BAD = [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0.type",
     "only text"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role", "goes in system"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages.0.content.0.type", "cannot hold"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages.0.content.0.tool_use_id", "tool_use_id"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]},
     "messages.0.content.0", "needs id and name"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content", "string or a list"),
    ({"messages": []}, "messages", "at least one"),
    ({"system": [{"type": "image"}]}, "system.0", "only text"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice", "tool_choice must be"),
    ({"tool_choice": {"type": ["auto"]}}, "tool_choice", "tool_choice must be"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "no tools"),
    ({"tools": [{"description": "no name"}]}, "tools.0.name", "needs a name"),
    ({"output_config": {"format": {"type": "xml"}}}, "output_config.format", "json_schema"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format", "json_schema"),  # no schema
    ({"temperature": 7}, "temperature", None),  # Anthropic's range is 0-1
    ({"container": "c1"}, "container", "server tools"),
    ({"max_tokens": 0}, "max_tokens", None),
    ({"max_tokens": 5000}, "messages", "max_tokens"),
    ({"model": "claude-sonnet-4"}, "model", "does not exist"),
]


@pytest.mark.parametrize("fields,param,words", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_what_cannot_be_served_is_an_error_in_anthropics_shape(server, fields, param, words):
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": ASK}], **fields}
    r = httpx.post(f"{server.url}/v1/messages", json=body, timeout=30)
    want = 404 if param == "model" else 400
    assert r.status_code == want, r.text
    assert r.json()["type"] == "error"
    err = r.json()["error"]
    assert err["type"] == ("not_found_error" if want == 404 else "invalid_request_error") and err["param"] == param
    assert words is None or words in err["message"], err
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_client_raises_its_own_error_classes(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "x"}])
    assert "goes in system" in e.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet-4", max_tokens=4, messages=[{"role": "user", "content": "x"}])


def test_a_client_that_leaves_mid_stream_stops_the_generation(server, client):
    before = server.metric("specllm_requests_cancelled_total", stage="running")
    with client.messages.stream(model=MODEL, max_tokens=1500, messages=[{"role": "user", "content": ASK}]) as s:
        for n, _ in enumerate(s.text_stream):
            if n >= 4:
                break
    assert server.wait_metric("specllm_requests_cancelled_total", before + 1, stage="running") == before + 1
    assert client.messages.create(model=MODEL, max_tokens=4, messages=[
        {"role": "user", "content": ASK}]).stop_reason == "max_tokens"


def test_the_api_key_as_x_api_key_and_errors_of_both_shapes(tiny_tools, make_llm):
    from specllm.server import create_app

    with TestClient(create_app(make_llm(tiny_tools), api_key="k3y")) as c:
        body = {"max_tokens": 2, "messages": [{"role": "user", "content": ASK}]}
        assert c.post("/v1/messages", json=body, headers={"x-api-key": "k3y"}).status_code == 200
        assert c.post("/v1/messages", json=body, headers={"Authorization": "Bearer k3y"}).status_code == 200
        wrong = c.post("/v1/messages", json=body, headers={"x-api-key": "nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        assert c.post("/v1/messages", json=body, headers={"Authorization": "Basic k3y", "x-api-key": "k3y"}
                      ).status_code == 401  # a key sent two ways that disagree is not guessed at
        chat = c.post("/v1/chat/completions", json={"messages": body["messages"]}, headers={"x-api-key": "nope"})
        assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape
        missing = c.post("/v1/messages", json={"max_tokens": 2}, headers={"x-api-key": "k3y"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"

