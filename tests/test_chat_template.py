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
])
def test_a_broken_or_unsafe_template_is_a_typed_error(llm, tmpl, match):
    with pytest.raises(specllm.InvalidOptionError, match=match):
        llm.apply_chat_template(HI, chat_template=tmpl)
    assert llm.generate("still fine", max_tokens=2).tokens


def test_an_unknown_built_in_name_is_a_typed_error(llm):
    with pytest.raises(specllm.InvalidOptionError, match="llama.cpp does not know"):
        llm.apply_chat_template(HI, chat_template="no-such-format")
