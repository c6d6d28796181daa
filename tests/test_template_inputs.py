"""What the server gives the chat template, as llama-server gives it: a GGUF's tool_use template when a request has
tools, the tools whatever tool_choice says, text parts joined with line breaks, an empty last assistant message
continued (not an empty turn and a new one), earlier calls' arguments as text to a template that adds them to
strings, and Anthropic's tools in OpenAI's key order. POST /apply-template shows the prompt; in-process app."""
import pytest
from fastapi.testclient import TestClient

from models.tiny import TOOLS_TEMPLATE

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HI = [{"role": "user", "content": "hi"}]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# DeepSeek V3's way with earlier calls: their arguments added to strings
ADDS_ARGUMENTS = ("{% for m in messages %}{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<call>"
                  "{{ c['function']['name'] + ':' + c['function']['arguments'] }}</call>{% endfor %}{% else %}"
                  "<{{ m['role'] }}>{{ m['content'] }}{% endif %}{% endfor %}")


def prompt(client, messages, **body) -> str:
    r = client.post("/apply-template", json={"messages": messages, **body})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.fixture(scope="module")
def two_templates(tmp_path_factory):
    """A tiny model that carries a ChatML default and the Hermes template as tool_use (as Hermes 2 Pro's GGUFs)."""
    from models.tiny import write_tiny_model
    return str(write_tiny_model(tmp_path_factory.mktemp("named") / "two.gguf", name="two-templates",
                                chat_template={"default": CHATML, "tool_use": "tools"}))


def test_a_requests_tools_choose_the_models_tool_use_template(two_templates, make_llm):
    from specllm.server import create_app

    llm = make_llm(two_templates)
    assert llm.chat_template == CHATML and llm.chat_template_for() == CHATML
    assert llm.chat_template_for([WEATHER]) == TOOLS_TEMPLATE
    assert llm.apply_chat_template(HI) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert "get_weather" in llm.apply_chat_template(HI, tools=[WEATHER])  # was left out with no word
    with TestClient(create_app(llm)) as c:
        assert "get_weather" in prompt(c, HI, tools=[WEATHER])
        r = c.post("/v1/chat/completions", json={"messages": HI, "tools": [WEATHER], "max_tokens": 4})
        assert r.status_code == 200, r.text  # was a 400: "does not ask for tool calls in the <tool_call> format"
        assert prompt(c, HI) == llm.apply_chat_template(HI)
        shown = c.post("/api/show", json={"model": "two"})
        assert shown.status_code == 200 and "tools" in shown.json()["capabilities"], shown.text  # Ollama's


def test_tools_reach_the_template_whatever_tool_choice_says(tools_local):
    from specllm.server import create_app

    with TestClient(create_app(tools_local)) as c:
        auto = prompt(c, HI, tools=[WEATHER])
        body = {"messages": HI, "tools": [WEATHER], "max_tokens": 2}
        counts = {choice: c.post("/v1/chat/completions", json=dict(body, tool_choice=choice)).json()["usage"]
                  ["prompt_tokens"] for choice in ("auto", "none")}
        assert "get_weather" in auto and counts["none"] == counts["auto"] == len(tools_local.prompt_tokens(auto))
        # an empty last assistant message: the reply from its start, as without it
        assert prompt(c, HI + [{"role": "assistant", "content": ""}]) == prompt(c, HI)
        # text parts joined with a line break (llama-server's concat_content_parts), none before the first text
        parts = [{"type": "text", "text": ""}, {"type": "text", "text": "Summarize:"}, {"type": "text", "text": "x"}]
        assert prompt(c, [{"role": "user", "content": parts}]) == prompt(c, [{"role": "user",
                                                                             "content": "Summarize:\nx"}])
        # Anthropic's tools as OpenAI's (name, description, parameters), so the two prompts are the same
        anthropic = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"],
                     "description": WEATHER["function"]["description"]}
        via_messages = c.post("/v1/messages/count_tokens", json={"model": "tiny-tools", "messages": HI, "tools": [anthropic]})
        assert via_messages.status_code == 200, via_messages.text
        assert via_messages.json()["input_tokens"] == len(tools_local.prompt_tokens(auto))


def test_a_template_that_adds_arguments_to_strings_gets_them_as_text(tiny, make_llm):
    from specllm.server import create_app

    llm = make_llm(tiny["target"], chat_template=ADDS_ARGUMENTS)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    messages = HI + [{"role": "assistant", "content": None, "tool_calls": [call]}]
    with TestClient(create_app(llm)) as c:
        assert prompt(c, messages) == '<user>hi<call>f:{"a": 1}</call>'  # was a 400 (str + dict)


def test_a_thinking_models_earlier_thoughts_and_its_switch(tiny, make_llm):
    """reasoning_content reaches the template (Qwen3's puts it back in agent turns; it was dropped), and
    enable_thinking must be a boolean: "false", a string, is true to a template (llama-server refuses it too)."""
    from specllm import InvalidOptionError
    from specllm.server import create_app

    shows = ("{% for m in messages %}<{{ m['role'] }}>{% if m['reasoning_content'] %}<think>"
             "{{ m['reasoning_content'] }}</think>{% endif %}{{ m['content'] }}{% endfor %}")
    llm = make_llm(tiny["target"], chat_template=shows)
    messages = HI + [{"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
                     {"role": "user", "content": "bye"}]
    assert "<assistant><think>greet back</think>hello" in llm.apply_chat_template(messages)
    with TestClient(create_app(llm)) as c:
        assert "<think>greet back</think>" in prompt(c, messages)
        r = c.post("/apply-template", json={"messages": HI, "chat_template_kwargs": {"enable_thinking": "false"}})
        assert r.status_code == 400 and "enable_thinking must be true or false" in r.text, r.text
    with pytest.raises(InvalidOptionError, match="enable_thinking must be true or false"):
        llm.apply_chat_template(HI, chat_template_kwargs={"enable_thinking": "false"})
