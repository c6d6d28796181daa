"""Hermes-style tool calls (<tool_call>{...}</tool_call>, what Qwen2.5's template asks for) parsed into OpenAI
tool_calls, whole and streamed in pieces that split the tags anywhere."""
import json
import re

import pytest

from specllm.server import tool_grammar, tools

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
TWO = CALL + "\n" + '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'


def test_a_call_is_taken_out_of_the_text():
    text, calls = tools.parse(CALL)
    assert text == "" and len(calls) == 1
    c = calls[0]
    assert c["type"] == "function" and c["id"].startswith("call_") and c["function"]["name"] == "get_weather"
    assert json.loads(c["function"]["arguments"]) == {"city": "Paris", "unit": "c"}


def test_two_calls_and_the_text_around_them():
    text, calls = tools.parse("Let me check.\n" + TWO + "\n")
    assert text == "Let me check." and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize("body", ['{"name": "f", "arguments": {"a": 1}', '["f"]', '{"arguments": {}}',
                                  '{"name": "f", "arguments": [1]}', '{"name": "", "arguments": {}}'])
def test_a_block_that_is_not_a_call_stays_text(body):
    reply = f"<tool_call>{body}</tool_call>"
    assert tools.parse(reply) == (reply, [])
    assert tools.parse(CALL + reply) == (CALL + reply, [])  # all or nothing: the reply as written


def test_arguments_written_as_a_json_string_are_accepted():
    _, calls = tools.parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}


def test_an_unclosed_block_is_text():
    assert tools.parse("<tool_call>{\"name\": \"f\"") == ("<tool_call>{\"name\": \"f\"", [])


def stream(pieces):
    s = tools.ToolStream()
    out = [s.feed(p) for p in pieces]
    rest, calls = s.finish()
    return "".join(out) + rest, out, calls


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
def test_a_streamed_reply_gives_the_same_text_and_calls_in_pieces_of_any_size(size):
    reply = "Checking the weather <b>now</b> <tool_ <tool_call" + "\n" + TWO
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    text, out, calls = stream(pieces)
    want_text, want_calls = tools.parse(reply)
    assert [c["function"] for c in calls] == [c["function"] for c in want_calls]
    assert "".join(out).startswith("Checking the weather <b>now</b> <tool_ <tool_call")  # passed on before the call
    assert text.strip() == want_text.strip()
    assert "<tool_call>" not in "".join(out)


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_whitespace_before_a_call_that_opens_the_reply_is_not_passed_on(size):
    reply = "\n\n" + CALL
    s = tools.ToolStream(names={"get_weather"})
    out = [s.pass_on(reply[i:i + size], i + size >= len(reply)) for i in range(0, len(reply), size)]
    assert "".join(text for text, _ in out) == "" and tools.parse(reply)[0] == ""
    assert [c["function"]["name"] for c in out[-1][1]] == ["get_weather"]


def test_a_streamed_reply_without_calls_is_passed_on_whole():
    reply = "x < y and <tool is not a call; <tool_call"  # the held tail comes out at the end
    text, out, calls = stream(list(reply))
    assert text == reply and calls == []


def test_a_streamed_block_that_is_not_a_call_comes_out_as_text():
    reply = "a <tool_call>not json</tool_call> b"
    text, _, calls = stream([reply[:5], reply[5:]])
    assert text == reply and calls == []


def test_templates_that_ask_for_hermes_calls():
    assert tools.template_calls_tools("... within <tool_call></tool_call> XML tags ...")
    assert not tools.template_calls_tools("{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.mark.parametrize("reply", ['```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
                                   ' {"name": "get_weather", "arguments": {"city": "Paris"}}\n'])
def test_a_reply_that_is_only_a_json_call_of_a_requested_tool_is_a_call(reply):
    # what Qwen2.5-Coder 1.5B answers to a tool prompt instead of the tagged block
    text, calls = tools.parse(reply, {"get_weather"})
    assert text == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert tools.parse(reply) == (reply, [])  # without the request's tool names: text
    assert tools.parse(reply, {"get_time"}) == (reply, [])  # a tool not asked for: text
    for size in (1, 4, 1000):
        s = tools.ToolStream({"get_weather"})
        out = "".join(s.feed(reply[i:i + size]) for i in range(0, len(reply), size))
        rest, streamed = s.finish()
        assert out.strip() == "" and rest == "" and streamed[0]["function"] == calls[0]["function"]


SAID_THEN_CALLED = 'Let me check the weather in Paris for you.\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'


@pytest.mark.parametrize("reply", [SAID_THEN_CALLED, SAID_THEN_CALLED.replace("\n{", "\n```json\n{") + "```",
                                   SAID_THEN_CALLED.replace(", ", ",\n  ").replace("\n{", "\n\n  {")])
def test_a_json_call_on_lines_of_its_own_after_text_is_a_call(reply):
    """What Qwen2.5-Coder 1.5B answers on a later turn of a tool conversation: a sentence, then the call as a bare
    JSON object. It was the reply's text on every API, and the call was lost."""
    text, calls = tools.parse(reply, {"get_weather"})
    assert text == "Let me check the weather in Paris for you." and len(calls) == 1, (text, calls)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert tools.parse(reply) == (reply, [])  # without the request's tool names: text
    assert tools.parse(reply, {"get_time"}) == (reply, [])  # a tool not asked for: text
    assert tools.parse(reply.rstrip() + "\nAnd more.", {"get_weather"})[1] == []  # not at the end: text
    for size in (1, 3, 1000):
        s = tools.ToolStream({"get_weather"})
        out = "".join(s.feed(reply[i:i + size]) for i in range(0, len(reply), size))
        rest, streamed = s.finish()
        assert out.strip() == text and rest.strip() == "" and streamed[0]["function"] == calls[0]["function"]


@pytest.mark.parametrize("pieces", [
    ["Let me check.\n", "  ", '{"name": "get_weather", "arguments": {"city": "Paris"}}'],  # indentation alone
    ["Let me check.", "\n", "\t", '{"name": "get_weather", "arguments": {"city": "Paris"}}'],
    ["Let me check.\n", '{"arguments": {"city": "Paris"}, "name": "get_weather"}']])  # the name after
def test_a_call_after_text_streams_as_a_call_however_its_pieces_fall(pieces):
    """The stream passed these on as text (a piece of indentation alone lost the line's start; the arguments before
    the name did not look like a call), while the whole reply was a call."""
    text, calls = tools.parse("".join(pieces), {"get_weather"})
    assert text == "Let me check." and len(calls) == 1
    s = tools.ToolStream({"get_weather"})
    out = "".join(s.feed(p) for p in pieces)
    rest, streamed = s.finish()
    assert (out + rest).strip() == text and [c["function"] for c in streamed] == [c["function"] for c in calls]


@pytest.mark.parametrize("reply", ['Here is some JSON:\n{"type": "point", "x": 1}\nDone.',
                                   'A person:\n{"name": "Alice", "age": 3}\nDone.',
                                   'Code:\n```python\nprint(1)\n```\nDone.'])
def test_json_after_text_that_is_not_a_call_streams_before_the_reply_ends(reply):
    s = tools.ToolStream({"get_weather"})
    out = "".join(s.feed(c) for c in reply)
    assert out.startswith(reply[:reply.index("\n", reply.index("\n") + 1)])  # passed on once it cannot be a call
    rest, calls = s.finish()
    assert out + rest == reply and calls == [] and tools.parse(reply, {"get_weather"}) == (reply, [])


@pytest.mark.parametrize("reply", ["```python\nprint(1)\n```", "{not json} and more", "`x` is a variable"])
def test_a_reply_that_only_looks_like_a_call_comes_out_whole(reply):
    s = tools.ToolStream({"get_weather"})
    out = "".join(s.feed(c) for c in reply)
    rest, calls = s.finish()
    assert out + rest == reply and calls == []


@pytest.mark.parametrize("fence", ["```python", "```bash ", "``` js", "```diff"])
def test_a_reply_opening_a_code_fence_of_another_language_streams_as_it_comes(fence):
    # any ``` at the start was held until the reply ended: a code answer of an editor in agent mode (which always
    # sends tools) came in one piece at the end; only a json or bare fence may be a call
    reply = fence + "\nprint(1)\nprint(2)\n```\n"
    s = tools.ToolStream({"get_weather"})
    out = [s.feed(c) for c in reply]
    assert "".join(out[:len(fence) + 1]) == fence + "\n"  # passed on with the fence's first line
    rest, calls = s.finish()
    assert "".join(out) + rest == reply and calls == []


def test_a_call_in_a_fence_of_another_language_is_text_whole_and_streamed_alike():
    # the stream passes a ```python fence on as text; the whole reply's parse took it as a call
    reply = '```python\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
    assert tools.reply_parts([WEATHER], "", reply) == (reply, [])
    s = tools.reply_stream([WEATHER], "")
    assert s.pass_on(reply, True) == (reply, [])
    for fence in ("```json", "```JSON", "```", "``` json "):  # these are calls, both ways
        reply = fence + '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
        assert len(tools.reply_parts([WEATHER], "", reply)[1]) == 1, fence
        assert len(tools.reply_stream([WEATHER], "").pass_on(reply, True)[1]) == 1, fence


def test_a_forced_call_cut_short_is_not_text_of_the_servers_opening():
    # max_tokens ended a forced call: the reply was the opening the server put in the prompt plus the model's piece
    opening = tool_grammar.forced_opening("required", [WEATHER])
    assert tools.reply_parts([WEATHER], opening, '{"city":') == ("", [])
    s = tools.reply_stream([WEATHER], opening)
    assert s.pass_on('{"city":', True) == ("", [])
    auto = '<tool_call>\n{"name": "get_weather", "arguments": {"city":'  # the model's own words: its text
    assert tools.reply_parts([WEATHER], "", auto) == (auto, [])


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {}}}


def test_a_forced_opening_and_the_models_rest_make_a_call():
    required = tool_grammar.forced_opening("required", [WEATHER, TIME])
    _, calls = tools.parse(required + 'get_time", "arguments": {"tz": "CET"}}\n</tool_call>')
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    named = tool_grammar.forced_opening({"type": "function", "function": {"name": "get_weather"}}, [WEATHER, TIME])
    assert named.startswith("<tool_call>") and '"get_weather"' in named
    # the model may end its turn without closing the block: the call is taken all the same
    text, calls = tools.parse(named + '{"city": "Paris"}}')
    assert text == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    s = tools.ToolStream(tools.names_of([WEATHER]))
    assert s.feed(named) == "" and s.feed('{"city": "Paris"}}') == ""
    assert [c["function"]["name"] for c in s.finish()[1]] == ["get_weather"]
    # a rest that is not JSON stays text, as the model (and the opening) wrote it
    assert tools.parse(named + "I cannot") == (named + "I cannot", [])
    assert tool_grammar.forced_opening("auto", [WEATHER]) == tool_grammar.forced_opening("none", [WEATHER]) == ""
    assert tool_grammar.forced_opening(None, None) == ""


@pytest.mark.parametrize("choice, tool_list, message", [
    ("required", None, "no tools"),
    # hosted tools only, or a function tool without its function: "required" opened a call no grammar could close
    # and answered 200 with max_tokens thrown away
    ("required", [{"type": "web_search"}], "no function tools"),
    ("required", [{"type": "function"}], "no function tools"),
    ({"type": "function", "function": {"name": "get_weather"}}, [], "no tools"),
    ({"type": "function", "function": {"name": "nope"}}, [WEATHER], "not among"),
    ({"type": "function"}, [WEATHER], "must be"),
    ("always", [WEATHER], "must be"),
    (3, [WEATHER], "must be"),
])
def test_a_tool_choice_that_cannot_be_honoured(choice, tool_list, message):
    with pytest.raises(ValueError, match=message):
        tool_grammar.forced_opening(choice, tool_list)


def test_a_forced_call_must_name_one_of_the_tools():
    required = tool_grammar.forced_opening("required", [WEATHER, TIME])
    reply = required + 'say_hello", "arguments": {}}\n</tool_call>'
    names = tools.names_of([WEATHER, TIME])
    assert tools.parse(reply, names, strict=True) == (reply, [])
    assert len(tools.parse(reply, names)[1]) == 1  # not forced: as the model wrote it (as llama-server does)
    s = tools.ToolStream(names, strict=True)
    s.feed(reply)
    assert s.finish() == ("", [])  # no call made: nothing of the server's opening is the model's text
    # one tool: "required" names it
    assert tool_grammar.forced_opening("required", [WEATHER]) == tool_grammar.forced_opening(
        {"type": "function", "function": {"name": "get_weather"}}, [WEATHER])


FORECAST = {"type": "function", "function": {"name": "get_forecast", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"},
                                     "hourly": {"type": "boolean"}},
    "required": ["unit", "days", "hourly"], "additionalProperties": False}}}


def follows_forecast(call):
    args = json.loads(call["function"]["arguments"])
    return (call["function"]["name"] == "get_forecast" and set(args) == {"unit", "days", "hourly"}
            and args["unit"] in ("celsius", "fahrenheit") and type(args["days"]) is int
            and type(args["hourly"]) is bool)


@pytest.mark.parametrize("choice", ["required", "named", "required-one"])
def test_a_forced_call_follows_the_tools_schemas(tiny, make_llm, choice):
    """The grammar of a forced call: a random tiny model, which never writes JSON of its own, writes a call of one
    of the tools whose arguments follow that tool's schema, with or without drafting."""
    tool_list = [FORECAST] if choice == "required-one" else [WEATHER, FORECAST]
    tool_choice = {"type": "function", "function": {"name": "get_forecast"}} if choice == "named" else "required"
    opening, (rules, lazy) = tool_grammar.forced_opening(tool_choice, tool_list), tool_grammar.call_grammar(tool_choice, tool_list)
    assert lazy == {}  # the grammar holds from the forced opening on
    names = tools.names_of(tool_list)
    for llm in (make_llm(tiny["target"]), make_llm(tiny["target"], tiny["near_draft"])):
        free = llm.generate("Hello world" + opening, max_tokens=60)
        assert tools.parse(opening + free.text, names, strict=True)[1] == []  # no call without the grammar
        for seed in range(3):
            c = llm.generate("Hello world" + opening, max_tokens=120, grammar=rules, temperature=0.0 if seed == 0
                             else 1.0, seed=seed)
            assert c.finish_reason == "stop", c.text
            text, calls = tools.parse(opening + c.text, names, strict=True)
            assert text == "" and len(calls) == 1, c.text
            if choice != "required":
                assert follows_forecast(calls[0]), calls
            else:  # the model named one of them, and its arguments follow that one's schema
                assert follows_forecast(calls[0]) or (calls[0]["function"]["name"] == "get_weather"
                                                      and isinstance(json.loads(calls[0]["function"]["arguments"]),
                                                                     dict)), calls


def test_a_tool_schema_the_converter_cannot_express_lets_its_arguments_be_any_object(tiny, make_llm):
    odd = {"type": "function", "function": {"name": "odd", "parameters": {"$ref": "#/nowhere"}}}
    rules, _ = tool_grammar.call_grammar("required", [odd])
    assert "arguments-0-any" in rules
    make_llm(tiny["target"]).check_options(grammar=rules)  # it parses
    rules, lazy = tool_grammar.call_grammar("auto", [odd])
    assert "arguments-0-any" in rules and lazy["grammar_triggers"] == [tools.OPEN]
    make_llm(tiny["target"]).check_options(grammar=rules, **lazy)
    assert tool_grammar.call_grammar("none", [odd]) == tool_grammar.call_grammar("auto", []) == (None, {})


def test_a_forced_calls_arguments_with_backslashes_and_any_values_parse(tiny, make_llm):
    """Arguments from a schema with a backslash in an enum and pydantic's list[Any] ({"items": {}}): a call whose
    JSON parses (the converter once wrote "C:\\dir" as invalid JSON, so the reply came back as text with no call, and
    list[Any] fell back to any object, losing the required properties)."""
    tool = {"type": "function", "function": {"name": "open_dir", "parameters": {
        "type": "object", "properties": {"path": {"enum": ["C:\\dir", "D:\\x\\y"]}, "extra": {"type": "array", "items": {}}},
        "required": ["path", "extra"], "additionalProperties": False}}}
    opening, (rules, _) = tool_grammar.forced_opening("required", [tool]), tool_grammar.call_grammar("required", [tool])
    assert "arguments-0-any" not in rules
    llm, done = make_llm(tiny["target"]), 0
    for seed in range(6):
        c = llm.generate("Hello world" + opening, max_tokens=200, grammar=rules, temperature=1.0, seed=seed)
        if c.finish_reason == "length":  # a random model's long string
            continue
        text, calls = tools.parse(opening + c.text, ["open_dir"], strict=True)
        args = json.loads(calls[0]["function"]["arguments"])
        assert text == "" and args["path"] in ("C:\\dir", "D:\\x\\y") and isinstance(args["extra"], list), c.text
        done += 1
    assert done >= 3


def test_with_tool_choice_auto_the_reply_is_free_until_it_opens_a_call_then_the_call_follows_the_schemas(
        tiny, make_llm):
    """tool_choice "auto": a lazy grammar (as llama-server's) from "<tool_call>" on. The random tiny model never
    writes that word, so the word is swapped for one it writes early in its reply to "Hello world" (":T", after
    "aron"); from there it writes calls of the request's tools whose arguments follow their schemas, greedy and
    sampled, with or without drafting."""
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}}}
    rules, lazy = tool_grammar.call_grammar("auto", [clock, FORECAST])
    assert lazy["grammar_triggers"] == [tools.OPEN] and rules.count('"<tool_call>"') == 1
    rules = rules.replace('"<tool_call>"', '":T"')
    names = tools.names_of([clock, FORECAST])
    for llm in (make_llm(tiny["target"]), make_llm(tiny["target"], tiny["near_draft"])):
        free = llm.generate("Hello world", max_tokens=60)
        at = free.text.index(":T")
        for seed in range(4):
            c = llm.generate("Hello world", max_tokens=200, grammar=rules, grammar_triggers=[":T"],
                             temperature=0.0 if seed == 0 else 1.0, seed=seed)
            if seed == 0:
                assert c.text[:at] == free.text[:at]  # free text until the word
            before, *blocks = c.text.split(":T")
            assert blocks or seed > 0, c.text  # a sample may never write the word: free text throughout
            if blocks and c.finish_reason == "stop":  # the whole reply reads as its calls (every block but the last
                text, calls = tools.reply_parts([clock, FORECAST], "", c.text.replace(":T", tools.OPEN))  # closed)
                assert text == before.strip() and len(calls) == len(blocks), c.text
            if c.finish_reason == "length" and blocks:  # the grammar allows call after call: the last one was cut
                blocks = blocks[:-1]
            for block in blocks:
                text, calls = tools.parse(tools.OPEN + block, names, strict=True)
                assert text == "" and len(calls) == 1, c.text
                args = json.loads(calls[0]["function"]["arguments"])
                assert follows_forecast(calls[0]) or args in ({"tz": "UTC"}, {"tz": "CET"}), calls
    # parallel_tool_calls false (Anthropic's disable_parallel_tool_use): one block, then the end
    one, _ = tool_grammar.call_grammar("auto", [clock, FORECAST], parallel=False)  # the tagged blocks' trigger alone
    c = make_llm(tiny["target"]).generate("Hello world", max_tokens=200, grammar=one.replace('"<tool_call>"', '":T"'),
                                          grammar_triggers=[":T"])
    assert c.finish_reason == "stop" and c.text.count(":T") == 1, c.text
    assert len(tools.parse(c.text.replace(":T", tools.OPEN), names, strict=True)[1]) == 1


def test_every_api_hands_auto_its_lazy_call_grammar_and_the_one_call_limit(tools_local):
    """What the chat, Responses and Messages requests become: tool_choice "auto" gets the lazy grammar from
    "<tool_call>" on; parallel_tool_calls false (Anthropic: disable_parallel_tool_use) allows one block."""
    from types import SimpleNamespace

    from specllm.server import messages, prepare, protocol, responses_request

    state = SimpleNamespace(llm=tools_local, cache_reuse=0)
    msgs = [{"role": "user", "content": "Hi"}]
    fn = {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
    tool = {"type": "function", "function": fn}
    many = 'root ::= ( ( tool-call "\\n"? "</tool_call>" [ \\t\\n]* )* tool-call'
    one = 'root ::= ( tool-call ( "\\n"? "</tool_call>" )? | json-call )'
    cases = [
        (protocol.ChatRequest(messages=msgs, tools=[tool]), many),
        (protocol.ChatRequest(messages=msgs, tools=[tool], parallel_tool_calls=False), one),
        (responses_request.chat_request(responses_request.ResponsesRequest(
            input="Hi", tools=[dict(fn, type="function")], parallel_tool_calls=False), msgs), one),
        (messages.chat_request(messages.MessagesRequest(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
            tools=[{"name": "get_time", "input_schema": fn["parameters"]}],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True})), one),
    ]
    for req, root in cases:
        opts = prepare.prepare_chat(state, req).opts
        assert opts["grammar_triggers"] == [tools.OPEN] and root in opts["grammar"], (req, opts["grammar"])
    opts = prepare.prepare_chat(state, protocol.ChatRequest(messages=msgs, tools=[tool], tool_choice="none")).opts
    assert "grammar" not in opts and "grammar_triggers" not in opts


def test_a_whole_reply_json_call_follows_the_schemas_and_parses(tiny, make_llm):
    """The other way "auto" constrains a call: a reply that opens with a bare or ```json-fenced object naming one of
    the tools (Qwen2.5-Coder 1.5B's way) goes on under the json-call rule, whitespace free as in pretty-printing.
    The random tiny model never opens so, so the rule is made the root here: whatever it lets the model write is a
    call parse() reads, with arguments that follow the schema."""
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}}}
    rules, lazy = tool_grammar.call_grammar("auto", [clock, FORECAST])
    pattern, after_text = lazy["grammar_trigger_patterns"]
    rules = re.sub(r"^root ::= .*$", "root ::= json-call", rules, flags=re.M)
    names = tools.names_of([clock, FORECAST])
    for llm in (make_llm(tiny["target"]), make_llm(tiny["target"], tiny["near_draft"])):
        for seed in range(4):
            c = llm.generate("Hello world", max_tokens=200, grammar=rules, temperature=0.0 if seed == 0 else 1.0,
                             seed=seed)
            assert c.finish_reason == "stop", c.text
            text, calls = tools.parse(c.text, names)
            assert text == "" and len(calls) == 1, c.text
            args = json.loads(calls[0]["function"]["arguments"])
            assert follows_forecast(calls[0]) or args in ({"tz": "UTC"}, {"tz": "CET"}), calls
            assert re.match(pattern, c.text)  # and such a reply's start is what fires the trigger
    # the trigger: a reply opening with an object that names a tool, fenced or not; not other JSON, code or text
    for text in ('{"name": "get_time", "arguments"', '```json\n{\n  "name": "get_forecast",', ' \n{"name":"get_time"'):
        assert re.match(pattern, text), text
    for text in ('{"name": "Alice", "age": 3}', '```python\nprint({"name": "get_time"})', 'Call {"name": "get_time"}',
                 '{"city": "Paris", "name": "get_time"}', '{   "name": "get_time"'):  # last: no grammar space
        assert not re.match(pattern, text), text
    # and one on a line of its own after text, where the grammar reads from the object (the group) on
    m = re.search(after_text, 'Let me check the time.\n{"name": "get_time", "arguments"')
    assert m and m.group(1) == '{"name": "get_time"'
    assert re.search(after_text, 'Sure.\n\n```json\n{\n  "name": "get_forecast",')
    for text in ('Call {"name": "get_time"}', 'Data:\n{"name": "Alice"}', 'x\n```python\nprint({"name": "get_time"'):
        assert not re.search(after_text, text), text


def test_odd_tool_lists_give_a_grammar_that_parses_or_none(tiny, make_llm):
    """Names with quotes, backslashes, regex specials or other scripts are escaped in the grammar (as JSON writes
    them) and in the trigger pattern; many tools (an agent's fifteen) are fine; hosted tools alone give no grammar;
    the request's schemas are left as they were ($refs resolved on a copy)."""
    llm = make_llm(tiny["target"])
    names = ['a"b\\c', "x.y-z(1)|[2]", "天気", "get_time"] + [f"tool_{i}_with_a_long_name" for i in range(15)]
    schema = {"$defs": {"tz": {"enum": ["UTC", "CET"]}}, "type": "object", "properties": {"tz": {"$ref": "#/$defs/tz"}}}
    tool_list = [{"type": "function", "function": {"name": n, "parameters": json.loads(json.dumps(schema))}}
                 for n in names]
    rules, lazy = tool_grammar.call_grammar("auto", tool_list)
    llm.check_options(grammar=rules, **lazy)  # parses, and the pattern compiles as llama.cpp's regex
    pattern, after_text = lazy["grammar_trigger_patterns"]
    for n in names:
        assert re.match(pattern, '```json\n{\n  "name": ' + json.dumps(n, ensure_ascii=False)), n
    assert not re.match(pattern, '{"name": "a"}')
    assert all(t["function"]["parameters"] == schema for t in tool_list)
    assert tool_grammar.call_grammar("auto", [{"type": "web_search"}, {"type": "function", "function": {"name": 5}}]) == \
        (None, {})


def test_a_format_beside_tools_lets_the_reply_be_a_call_or_that_json(tiny, make_llm):
    """call_or_format: the call grammar's rules and the format's, named apart under one root. With the tokens that
    open a call's other forms banned (a tagged block, a fence, leading whitespace), the tiny model writes both: a bare
    JSON call of a tool, or the format's object (5 and 11 of 16 seeds); each whole reply is one of them, read as
    parse() reads it."""
    from specllm import grammar
    colour = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"],
              "additionalProperties": False}
    rules, lazy = tool_grammar.call_or_format(tool_grammar.call_grammar("auto", [FORECAST]),
                                       grammar.response_format({"type": "json_schema",
                                                                "json_schema": {"name": "c", "schema": colour}}))
    assert lazy == {} and rules.count("root ::=") == 3  # the call's, the format's, and theirs
    llm = make_llm(tiny["target"])
    target = llm._engine.target
    ban = {t: -100.0 for t in range(target.n_vocab) if target.piece(t)[:1] in (b"<", b"`", b" ", b"\n", b"\t")}
    # ... and "c" raised: after '{"' this random model all but always wrote "name" (a call), never "colour"
    ban.update({t: 8.0 for t in range(target.n_vocab) if target.piece(t) == b"c"})
    kinds = []
    for seed in range(16):
        c = llm.generate("Hello world", max_tokens=120, grammar=rules, temperature=1.0, seed=seed, logit_bias=ban)
        if c.finish_reason != "stop":
            continue
        text, calls = tools.parse(c.text, {"get_forecast"})
        if calls:
            assert text == "" and follows_forecast(calls[0]), c.text
            kinds.append("call")
        else:
            assert json.loads(c.text)["colour"] in ("red", "green", "blue"), c.text
            kinds.append("json")
    assert "call" in kinds and "json" in kinds, kinds
    # a forced call stays that call
    forced = tool_grammar.call_grammar("required", [FORECAST])
    assert tool_grammar.call_or_format(forced, "root ::= \"x\"") == forced
    # a format with a rule named like a number: the counts of a repetition ({1,15}) are not renamed (a 400 before)
    numbered = grammar.json({"type": "object", "properties": {"1": {"type": "integer", "minimum": 0}}})
    from specllm import _core
    assert _core.gbnf_error(tool_grammar.call_or_format(tool_grammar.call_grammar("auto", [FORECAST]),
                                                        numbered)[0]) == ""


def test_llm_chat_hands_tools_to_the_template(tools_local):
    """llm.chat(messages, tools=...) raised "make_options() got an unexpected keyword argument 'tools'"; the tools
    now go to the chat template, as apply_chat_template takes them."""
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    prompt = tools_local.apply_chat_template(messages, tools=[WEATHER])
    assert "get_weather" in prompt and "get_weather" not in tools_local.apply_chat_template(messages)
    got = tools_local.chat(messages, tools=[WEATHER], max_tokens=6)
    assert got.tokens == tools_local.generate(prompt, max_tokens=6).tokens
