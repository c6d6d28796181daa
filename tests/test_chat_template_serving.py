"""The chat template through specllm-cli and the server, as llama-server takes it: --chat-template /
--chat-template-file and --chat-template-kwargs (chat, generate, serve), a request's own chat_template_kwargs on
/v1/chat/completions, and POST /apply-template (the prompt a conversation makes, nothing generated). Each checked
against the library with the same template and variables, and the bad ones."""
import json
import signal

import httpx
import pytest

from helpers import cli_env, run_cli
from serving import Server, post_json

HI = [{"role": "user", "content": "the cat sat on"}]
THINKING = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{{ style | default('') }}{% endif %}")
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "thinking.jinja"
    path.write_text(THINKING, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def server(tiny, template_file, tmp_path_factory):
    s = Server("--model", tiny["target"], "--draft", "ngram", "--threads", "1", "--ctx", "512",
               "--chat-template-file", template_file, "--chat-template-kwargs", json.dumps(OFF),
               log_path=tmp_path_factory.mktemp("serve") / "server.log").wait_healthy()
    yield s
    assert s.stop(signal.SIGINT) == 0, s.log()


@pytest.fixture(scope="module")
def local(tiny, make_llm):
    return make_llm(tiny["target"], chat_template=THINKING, chat_template_kwargs=OFF)


def test_apply_template_and_chat_use_the_servers_template_and_a_requests_variables(server, local):
    import openai

    status, r = post_json(server.url, "/apply-template", messages=HI)
    assert status == 200 and r == {"prompt": "<user>the cat sat on<assistant><think></think>"}
    status, r = post_json(server.url, "/apply-template", messages=HI, chat_template_kwargs={"enable_thinking": True,
                                                                                          "style": "terse"})
    assert status == 200 and r["prompt"] == "<user>the cat sat on<assistant>terse"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    for kwargs in (None, {"enable_thinking": True}):
        extra = {} if kwargs is None else {"extra_body": {"chat_template_kwargs": kwargs}}
        got = client.chat.completions.create(model="target", messages=HI, max_tokens=12, temperature=0, **extra)
        prompt = local.apply_chat_template(HI, chat_template_kwargs=kwargs)
        want = local.generate(prompt, max_tokens=12)
        assert got.choices[0].message.content == want.text
        assert got.usage.prompt_tokens == len(local.prompt_tokens(prompt))
    # the Responses API takes them too (it is served as the chat request it amounts to)
    got = client.responses.create(model="target", input="the cat sat on", max_output_tokens=12, temperature=0,
                                  extra_body={"chat_template_kwargs": {"style": "terse"}})
    prompt = local.apply_chat_template(HI, chat_template_kwargs={"style": "terse"})
    assert got.output_text == local.generate(prompt, max_tokens=12).text
    r = httpx.get(f"{server.url}/props", timeout=10).json()  # the template in use
    assert r["chat_template"] == THINKING


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", dict(messages=HI, chat_template_kwargs={"messages": []}), "chat_template_kwargs"),
    ("/v1/chat/completions", dict(messages=HI, chat_template_kwargs={"a b": 1}), "chat_template_kwargs"),
    ("/v1/chat/completions", dict(messages=HI, chat_template_kwargs=["x"]), "chat_template_kwargs"),
    ("/apply-template", dict(messages=HI, chat_template_kwargs={"bos_token": "x"}), "chat_template_kwargs"),
    ("/v1/responses", dict(input="hi", chat_template_kwargs={"tools": 1}), "chat_template_kwargs"),
    ("/apply-template", dict(messages=[]), "messages"),
    ("/apply-template", dict(messages=[{"role": "nobody", "content": "x"}]), "messages"),
    ("/apply-template", dict(), "messages"),
])
def test_bad_template_requests_are_400s_that_name_the_field(server, path, body, param):
    status, r = post_json(server.url, path, **body)
    assert status == 400 and r["error"]["param"].split(".")[0] == param, r
    status, r = post_json(server.url, "/apply-template", messages=HI)
    assert status == 200


# --- specllm-cli

cli = run_cli


@pytest.fixture
def env(tmp_path):
    return cli_env(tmp_path)


def test_generate_takes_the_template_flags_as_the_library(tiny, template_file, local, env):
    base = ("generate", "the cat sat on", "--max-tokens", "12", "--model", tiny["target"], "--draft", "none",
            "--threads", "1")
    r = cli(env, *base, "--chat-template-file", template_file, "--chat-template-kwargs", '{"enable_thinking": true}')
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == local.chat(HI, max_tokens=12, chat_template_kwargs={"enable_thinking": True}).text
    r = cli(env, *base, "--chat-template", THINKING, "--chat-template-kwargs", json.dumps(OFF))
    assert r.returncode == 0 and r.stdout.rstrip("\n") == local.chat(HI, max_tokens=12).text, r.stderr


@pytest.mark.parametrize("flags, code, words", [
    (["--chat-template-kwargs", "{enable_thinking: false}"], 2, "argument --chat-template-kwargs: not JSON"),
    (["--chat-template-kwargs", "[1]"], 2, "give a JSON object"),
    (["--chat-template-file", "/nonexistent/t.jinja"], 2, "argument --chat-template-file: cannot read the template"),
    (["--chat-template", "chatml", "--chat-template-file", "/etc/hostname"], 2, "not allowed with argument"),
    (["--chat-template", "no-such-format"], 1, "--chat-template 'no-such-format' is neither a Jinja template"),
    (["--chat-template", "{% for m in messages %}"], 1, "not a valid Jinja template"),
    (["--chat-template-kwargs", '{"messages": 1}'], 1, "set for every template"),
])
def test_bad_template_flags_are_one_line_errors(tiny, env, flags, code, words):
    r = cli(env, "generate", "hi", "--model", tiny["target"], "--draft", "none", "--threads", "1", *flags)
    assert r.returncode == code and words in r.stderr, r.stderr
    if code == 1:
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
