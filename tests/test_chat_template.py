"""Chat templates: the model's Jinja template rendered as transformers and llama-server --jinja render it, llama.cpp's
built-in formats by name, and a typed error for a template that is broken or refuses the conversation."""
import pytest

import specllm

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(tiny, make_llm):
    return make_llm(tiny["target"])


def test_the_models_own_template_renders_as_before_on_a_plain_chatml_template(llm):
    # the tiny model's template is plain ChatML: Jinja and llama.cpp's built-in formatting agree on it
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    jinja = llm.apply_chat_template(conv)
    assert jinja == llm.apply_chat_template(conv, chat_template="llama.cpp")
    assert jinja == llm.apply_chat_template(conv, chat_template="chatml")
    assert jinja.endswith("<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    assert not llm.apply_chat_template(conv, add_generation_prompt=False).endswith("assistant\n")


def test_a_jinja_template_given_is_rendered_with_the_models_special_tokens(llm):
    out = llm.apply_chat_template(HI, chat_template="[{{ bos_token }}|{{ eos_token }}]{% for m in messages %}"
                                                    "{{ m['role'] | upper }}={{ m['content'] | tojson }}{% endfor %}"
                                                    "{% if add_generation_prompt %}>{% endif %}")
    bos, eos = llm._engine.target.bos_text, llm._engine.target.eos_text
    assert bos and eos and bos != eos
    assert len(llm.tokenize(bos, add_special=False)) == 1 == len(llm.tokenize(eos, add_special=False))  # a token's text
    assert out == f'[{bos}|{eos}]USER="hi">'


def test_a_template_that_refuses_the_conversation_is_a_typed_error(llm):
    tmpl = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message must come first') }}"
            "{% endif %}{{ messages[0]['content'] }}")
    with pytest.raises(specllm.InvalidOptionError, match="chat_template= refuses these messages: a system message "
                                                         "must come first"):
        llm.apply_chat_template(HI, chat_template=tmpl)
    assert llm.apply_chat_template([{"role": "system", "content": "ok"}], chat_template=tmpl) == "ok"


@pytest.mark.parametrize("tmpl, match", [
    ("{% for m in messages %}{{ m }}", "not a valid Jinja template"),
    ("{{ messages[5]['content'] }}", "failed on these messages"),
    ("{{ messages.__class__.__mro__ }}", "failed on these messages"),  # the sandbox: no attribute escapes
    ("{{ ''.__class__.__subclasses__() }}", "failed on these messages"),
    ("{{ 1/0 }}", "failed on these messages"),  # ZeroDivisionError escaped
    ("{% for i in range(10**9) %}x{% endfor %}", "failed on these messages"),  # the sandbox's OverflowError
])
def test_a_broken_or_unsafe_template_is_a_typed_error(llm, tmpl, match):
    with pytest.raises(specllm.InvalidOptionError, match=match):
        llm.apply_chat_template(HI, chat_template=tmpl)
    assert llm.generate("still fine", max_tokens=2).tokens


def test_an_unknown_built_in_name_is_a_typed_error(llm):
    with pytest.raises(specllm.InvalidOptionError, match="neither a Jinja template nor one of llama.cpp's built-in"):
        llm.apply_chat_template(HI, chat_template="no-such-format")  # the caller's name, not the model's template


# --- LLM(chat_template=..., chat_template_kwargs=...), chat_template_kwargs per call (llama-server's options)

THINKING = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{{ style | default('') }}{% endif %}")


def test_an_llms_own_template_and_variables_format_every_conversation(tiny, make_llm):
    llm = make_llm(tiny["target"], chat_template=THINKING, chat_template_kwargs={"enable_thinking": False})
    assert llm.chat_template == THINKING
    assert llm.apply_chat_template(HI) == "<user>hi<assistant><think></think>"
    # a call's variables go over the LLM's; a variable the template does not read changes nothing
    assert llm.apply_chat_template(HI, chat_template_kwargs={"enable_thinking": True}) == "<user>hi<assistant>"
    assert llm.apply_chat_template(HI, chat_template_kwargs={"style": "terse", "unread": 1}) == \
        "<user>hi<assistant><think></think>terse"
    # chat() formats with them: the reply is generate()'s of that prompt
    want = llm.generate("<user>hi<assistant>", max_tokens=8)
    assert llm.chat(HI, max_tokens=8, chat_template_kwargs={"enable_thinking": True}).tokens == want.tokens
    # a template named per call still wins; a built-in format has no variables and ignores them
    plain = make_llm(tiny["target"])
    assert llm.apply_chat_template(HI, chat_template="chatml") == plain.apply_chat_template(HI)
    named = make_llm(tiny["target"], chat_template="chatml", chat_template_kwargs={"enable_thinking": False})
    assert named.chat_template == "chatml" and named.apply_chat_template(HI) == plain.apply_chat_template(HI)
    assert plain.chat_template == plain._engine.target.chat_template  # none given: the model's own


@pytest.mark.parametrize("kw, error, match", [
    (dict(chat_template="{% for m in messages %}"), specllm.InvalidOptionError, "not a valid Jinja template"),
    (dict(chat_template=3), TypeError, "chat_template"),
    (dict(chat_template_kwargs=["enable_thinking"]), TypeError, "must be a dict"),
    (dict(chat_template_kwargs={"messages": []}), specllm.InvalidOptionError, "set for every template"),
    (dict(chat_template_kwargs={"add_generation_prompt": False}), specllm.InvalidOptionError, "set for every"),
    (dict(chat_template_kwargs={"not a name": 1}), specllm.InvalidOptionError, "not a name a template can read"),
    (dict(chat_template_kwargs={1: 1}), specllm.InvalidOptionError, "not a name a template can read"),
])
def test_a_bad_template_or_variable_is_a_typed_error_before_the_model_loads(tiny, kw, error, match, monkeypatch):
    import specllm._core as core

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(core, "Engine", no_load)
    with pytest.raises(error, match=match):
        specllm.LLM(tiny["target"], None, **kw)


def test_an_unknown_built_in_name_given_at_load_and_bad_variables_per_call_are_typed_errors(tiny, make_llm, llm):
    with pytest.raises(specllm.InvalidOptionError, match="chat_template='no-such-format' is neither a Jinja template "
                       "nor one of llama.cpp's built-in format names"):  # it blamed "this model's chat template"
        make_llm(tiny["target"], chat_template="no-such-format")
    with pytest.raises(specllm.InvalidOptionError, match="set for every template"):
        llm.chat(HI, max_tokens=2, chat_template_kwargs={"tools": []})
    with pytest.raises(TypeError, match="must be a dict"):
        llm.apply_chat_template(HI, chat_template_kwargs="enable_thinking=false")
    assert llm.chat(HI, max_tokens=2).tokens
