"""The default pair (Qwen2.5-Coder 1.5B + 0.5B, hybrid drafting, "auto") served by `specllm-cli serve` and asked
through the official `openai` client answers with LLM.chat's text."""

import signal

import openai
import pytest

from serving import Server

pytestmark = pytest.mark.real

MESSAGES = [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}]


def test_default_pair_through_the_openai_client(real_models, tmp_path):
    import specllm

    s = Server("--threads", "2", "--ctx", "2048", log_path=tmp_path / "server.log").wait_healthy(timeout=600)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["qwen2.5-coder-1.5b"]
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=MESSAGES, max_tokens=48)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="qwen2.5-coder-1.5b", messages=MESSAGES, max_tokens=48, stream=True) if c.choices)
        # n and logit_bias on the real pair: two choices; the reply's first token banned, another one first
        two = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=MESSAGES, max_tokens=6, n=2,
                                             temperature=0.8, seed=3)
        free = _complete(s, "def squares(numbers):\n    return", n_predict=4)
        banned = _complete(s, "def squares(numbers):\n    return", n_predict=4, logit_bias=[[free[0], False]])
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()
    # the same default configuration and the same two calls: in fast mode (the default) the second, identical
    # request may read differently from the first (it reuses the first's KV cache and drafting memory, which
    # changes batch shapes and can flip a near-tie), so each answer is compared with its in-process counterpart
    llm = specllm.LLM("qwen2.5-coder-1.5b", n_threads=2, n_ctx=2048)
    want = llm.chat(MESSAGES, max_tokens=48)
    want_streamed = "".join(c.text for c in llm.chat(MESSAGES, max_tokens=48, stream=True))
    assert r.choices[0].message.content == want.text
    assert streamed == want_streamed
    assert r.usage.completion_tokens == want.stats.n_generated == 48
    assert r.model_extra["speculative"]["steps"] <= 48
    assert [c.index for c in two.choices] == [0, 1] and all(c.message.content for c in two.choices)
    assert two.usage.completion_tokens == 12
    assert len(free) == len(banned) == 4 and banned[0] != free[0]


def _complete(server, prompt: str, **body) -> list:
    """The token ids llama-server's /completion generates for prompt, greedy."""
    import httpx

    r = httpx.post(f"{server.url}/completion", json=dict(body, prompt=prompt, temperature=0, return_tokens=True),
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city's name"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "description": "an IANA time zone"}},
                   "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]


def test_tool_calls_through_the_openai_client(real_models, tmp_path):
    # Qwen2.5's template asks for <tool_call>{...}</tool_call> (the 1.5B coder answers with the JSON call in a
    # ```json fence instead); the server returns OpenAI tool_calls, whole and streamed, and renders the call and the
    # tool's answer back into the next prompt
    import json

    s = Server("--threads", "2", "--ctx", "2048", log_path=tmp_path / "server.log").wait_healthy(timeout=600)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=300)
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[WEATHER], max_tokens=64)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.function.arguments)["city"] == "Paris"
        assert not (choice.message.content or "").strip()

        names, args, finish, text = {}, {}, None, ""
        for c in client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[WEATHER],
                                                max_tokens=64, stream=True):
            if not c.choices:
                continue
            d = c.choices[0].delta
            text += d.content or ""
            for tc in d.tool_calls or []:
                names[tc.index] = (names.get(tc.index) or "") + (tc.function.name or "")
                args[tc.index] = (args.get(tc.index) or "") + (tc.function.arguments or "")
            finish = c.choices[0].finish_reason or finish
        assert finish == "tool_calls" and names == {0: "get_weather"} and json.loads(args[0])["city"] == "Paris"
        assert "<tool_call>" not in text

        follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 17, "sky": "rain"}'}]
        r2 = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=follow, tools=[WEATHER],
                                            max_tokens=48)
        # the call and the tool's answer are rendered into the prompt (the 1.5B model's reply to them is its own
        # business: it tends to call again), and the first request's prompt is reused as its prefix
        assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert r2.usage.prompt_tokens > r.usage.prompt_tokens
        assert r2.usage.prompt_tokens_details.cached_tokens > 0

        r3 = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[WEATHER],
                                            tool_choice="none", max_tokens=16)
        assert r3.choices[0].message.tool_calls is None
        # tool_choice "required" and a named function: the reply is opened as a call, and a grammar from the tools'
        # schemas makes the model write the rest as a call of one of them with arguments that follow its schema.
        # With one tool "required" names it, even for a question that asks for no tool; with several the model
        # names one (asked "Say hello." with both tools, the 1.5B model named a "say_hello" of its own before the
        # grammar: text, not a call)
        chat = [{"role": "user", "content": "Say hello."}]
        r4 = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=chat, tools=[TIME],
                                            tool_choice="required", max_tokens=64)
        assert r4.choices[0].finish_reason == "tool_calls", r4.choices[0]
        assert r4.choices[0].message.tool_calls[0].function.name == "get_time"
        assert set(json.loads(r4.choices[0].message.tool_calls[0].function.arguments)) == {"tz"}
        r4 = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=chat, tools=[TIME, WEATHER],
                                            tool_choice="required", max_tokens=64)
        assert r4.choices[0].finish_reason == "tool_calls", r4.choices[0]
        (call,) = r4.choices[0].message.tool_calls
        assert call.function.name in ("get_time", "get_weather"), call
        assert set(json.loads(call.function.arguments)) <= {"tz", "city"}, call
        r4 = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[TIME, WEATHER],
                                            tool_choice="required", max_tokens=64)
        assert [c.function.name for c in r4.choices[0].message.tool_calls] == ["get_weather"], r4.choices[0]
        named = {"type": "function", "function": {"name": "get_time"}}
        r5 = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[WEATHER, TIME],
                                            tool_choice=named, max_tokens=64)
        (call,) = r5.choices[0].message.tool_calls
        assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments), dict)
        streamed = [c for c in client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK,
                                                              tools=[WEATHER, TIME], tool_choice=named,
                                                              max_tokens=64, stream=True) if c.choices]
        assert streamed[-1].choices[0].finish_reason == "tool_calls"
        assert [tc.function.name for c in streamed for tc in c.choices[0].delta.tool_calls or []] == ["get_time"]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[WEATHER],
                                           tool_choice=named, max_tokens=16)
        assert e.value.body["param"] == "tool_choice" and "get_time" in e.value.body["message"], e.value.body

        # the Responses API (what agents call): the same call as a function_call item, then the call and the
        # tool's output sent back as input items, the first request's prompt the second's cached prefix
        weather = {"type": "function", **WEATHER["function"]}
        q = ASK[0]["content"]
        r6 = client.responses.create(model="qwen2.5-coder-1.5b", input=q, tools=[weather], max_output_tokens=64)
        assert r6.status == "completed" and [i.type for i in r6.output] == ["function_call"], r6.output
        call = r6.output[0]
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] == "Paris"
        items = [{"role": "user", "content": q}, call.model_dump(exclude_none=True),
                 {"type": "function_call_output", "call_id": call.call_id,
                  "output": '{"temperature_c": 17, "sky": "rain"}'}]
        r8 = client.responses.create(model="qwen2.5-coder-1.5b", input=items, tools=[weather], max_output_tokens=24)
        assert r8.usage.input_tokens > r6.usage.input_tokens
        assert r8.usage.input_tokens_details.cached_tokens >= r6.usage.input_tokens - 1  # all of r6's prompt
        events = list(client.responses.create(model="qwen2.5-coder-1.5b", input=items, tools=[weather],
                                              tool_choice="none", max_output_tokens=24, stream=True))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas.strip() and events[-1].type in ("response.completed", "response.incomplete")
        assert events[-1].response.output[0].content[0].text == deltas

        # Anthropic's Messages API: the same call as a tool_use block, its result sent back as a tool_result block
        import anthropic

        claude = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=300)
        tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
                "input_schema": WEATHER["function"]["parameters"]}
        m = claude.messages.create(model="qwen2.5-coder-1.5b", max_tokens=64, tools=[tool],
                                   messages=[{"role": "user", "content": q}])
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"], m.content
        assert m.content[0].name == "get_weather" and m.content[0].input["city"] == "Paris"
        turn = [{"role": "user", "content": q}, {"role": "assistant", "content": [m.content[0].model_dump()]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[0].id,
                                              "content": '{"temperature_c": 17, "sky": "rain"}'}]}]
        with claude.messages.stream(model="qwen2.5-coder-1.5b", max_tokens=24, tools=[tool],
                                    tool_choice={"type": "none"}, messages=turn) as stream:
            said = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert said.strip() and final.content[0].text == said and final.stop_reason in ("end_turn", "max_tokens")

        # Ollama's API: the call as the message's tool_calls, its arguments an object
        import ollama

        o = ollama.Client(host=s.url, timeout=300).chat(model="qwen2.5-coder-1.5b", tools=[WEATHER],
                                                         messages=[{"role": "user", "content": q}],
                                                         options={"temperature": 0, "num_predict": 64})
        assert [(c.function.name, c.function.arguments["city"]) for c in o.message.tool_calls] == [
            ("get_weather", "Paris")], o.message
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "languages"], "additionalProperties": False}


def test_json_replies_through_the_openai_client(real_models, tmp_path):
    """response_format json_object and json_schema: JSON that parses (and follows the schema). The schema is not in
    the prompt (as with llama-server): the grammar alone makes the reply follow it."""
    import json

    s = Server("--threads", "2", "--ctx", "2048", log_path=tmp_path / "server.log").wait_healthy(timeout=600)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=300)
        ask = [{"role": "user", "content": "Describe a fictional programmer: name, age and their two favourite languages."}]
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ask, max_tokens=200,
                                           response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        assert isinstance(json.loads(r.choices[0].message.content), dict)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ask, max_tokens=200,
                                           response_format=fmt)
        person = json.loads(r.choices[0].message.content)
        assert set(person) == {"name", "age", "languages"} and isinstance(person["age"], int)
        assert all(isinstance(x, str) for x in person["languages"])
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="qwen2.5-coder-1.5b", messages=ask, max_tokens=200, response_format=fmt, stream=True)
            if c.choices)
        assert set(json.loads(streamed)) == {"name", "age", "languages"}
        # beside tools (an agent with an output type): a call of the tool, or JSON; the weather question gets the call
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=ASK, tools=[WEATHER],
                                           response_format={"type": "json_object"}, max_tokens=60)
        message = r.choices[0].message
        assert message.tool_calls or isinstance(json.loads(message.content), dict), message
        assert r.choices[0].finish_reason in ("tool_calls", "stop"), r.choices[0]
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


def test_an_editor_plugins_infill_request(real_models, tmp_path):
    # what llama.vscode sends to llama-server's /infill, to the default pair served with llama.vscode's suggested
    # --cache-reuse: chunks of other files, the cursor inside a function, its samplers (top_k 1 here, so that the
    # middle is the model's best), the line's indentation as n_indent and a time limit. First the request that only
    # puts the chunks into the cache; then the ring of chunks rotates (the oldest out, a new one in) before the
    # completion is asked for, and the chunk both hold is moved in the cache instead of decoded again
    import httpx

    files = [("util.py", "def mul(a, b):\n    return a * b\n"),
             ("shapes.py", "".join(f"def area_{i}(w, h):\n    return w * h * {i}\n\n" for i in range(12))),
             ("io.py", "def read(path):\n    with open(path) as f:\n        return f.read()\n")]
    chunks = [{"filename": f, "text": t} for f, t in files]
    request = dict(input_prefix="from util import mul\n\n\ndef add(a, b):\n    ", input_suffix="\n\n\nprint(add(2, 3))\n",
                   input_extra=chunks[1:], prompt="", n_predict=24, top_k=1, top_p=0.99,
                   samplers=["top_k", "top_p", "infill"], stream=False, cache_prompt=True, t_max_prompt_ms=500,
                   t_max_predict_ms=10000, n_indent=4)
    s = Server("--threads", "2", "--ctx", "2048", "--cache-reuse", "16",
               log_path=tmp_path / "server.log").wait_healthy(timeout=600)
    try:
        warm = httpx.post(f"{s.url}/infill", json=dict(request, input_extra=chunks[:2], n_predict=0,
                                                       t_max_predict_ms=1), timeout=300)
        assert warm.status_code == 200 and warm.json()["content"] == "", warm.text
        r = httpx.post(f"{s.url}/infill", json=request, timeout=300)
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()
    assert r.status_code == 200, r.text
    body = r.json()
    # the body, cut where a line indented less than 4 begins (the blank line after it), as llama-server cuts it
    assert body["content"] == "return a + b\n" and body["stop_type"] == "limit", body
    print("\n/infill after the ring rotated:", body["timings"], "of", body["tokens_evaluated"], "prompt tokens")
    # shapes.py (~190 tokens) was moved up past util.py instead of decoded again
    assert body["timings"]["cache_n"] >= 180 and body["timings"]["prompt_n"] < body["tokens_evaluated"] - 180, body
