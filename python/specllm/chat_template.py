"""Chat templates as the model's authors wrote them: the Jinja template in the GGUF (tokenizer.chat_template),
rendered as Hugging Face transformers, llama-cpp-python and llama-server --jinja render it. Before, specllm passed
the template to llama.cpp's llama_chat_apply_template, which recognises a template's family and formats it with its
own C++ code: close, but not the template (Qwen2.5's default system message was missing, so a conversation without
a system message was a different prompt than in every other tool).

jinja2: the library the templates are written for (sandboxed, as transformers uses it); llama-cpp-python already
depends on it."""
from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import List, Optional, Sequence

from . import _core
from .errors import InvalidOptionError
from .options import flag
from .options import text as _text

# chat_template= this name: llama.cpp's built-in formatting of the model's own template (what specllm did up to
# 2026-11-26; bench replays runs recorded before with it)
LLAMA_CPP = "llama.cpp"
# the variables every template is rendered with: chat_template_kwargs cannot set them
RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token", "tools")


def is_jinja(template: str) -> bool:
    """A Jinja template, not one of llama.cpp's built-in format names ("chatml", "llama3", ...)."""
    return "{{" in template or "{%" in template


class _TemplateRaised(Exception):
    pass


def _raise(message):
    raise _TemplateRaised(str(message))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # as transformers renders it (not jinja2's HTML-safe tojson)
    text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a tool's enum "\ud800"): escaped, or the prompt is refused
        text = json.dumps(x, ensure_ascii=True, indent=indent, separators=separators, sort_keys=sort_keys)
    return text


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):  # transformers' {% generation %} ... {% endgeneration %}: pass through
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def check_messages(messages) -> List[dict]:
    """The messages as a template gets them: str role and content; an assistant message may carry tool_calls
    (a list of dicts; its content may then be None) and reasoning_content, a tool message tool_call_id and name
    (str)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidOptionError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if (not isinstance(m, dict) or not isinstance(m.get("role"), str)
                or not (isinstance(content, str) or (content is None and calls))):
            raise InvalidOptionError(f"each message must be a dict with str 'role' and 'content', got {m!r}")
        msg = {"role": _text("role", m["role"]), "content": None if content is None else _text("content", content)}
        if calls is not None:
            if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
                raise InvalidOptionError(f"messages[{i}].tool_calls must be a list of dicts, got {calls!r}")
            msg["tool_calls"] = calls
        for key in ("tool_call_id", "name", "reasoning_content"):  # reasoning_content: a thinking model's earlier
            if m.get(key) is not None:                               # thoughts, which Qwen3's template puts back
                if not isinstance(m[key], str):
                    raise InvalidOptionError(f"messages[{i}].{key} must be a str, got {m[key]!r}")
                msg[key] = _text(key, m[key])
        out.append(msg)
    return out


def check_tools(tools) -> Optional[List[dict]]:
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
        raise InvalidOptionError(f"tools must be a list of dicts (OpenAI's {{'type': 'function', 'function': "
                                 f"{{...}}}}), got {tools!r}")
    return list(tools) or None


def check_kwargs(kwargs, name: str = "chat_template_kwargs") -> dict:
    """A template's own variables (Qwen3's enable_thinking, ...): a dict of names to values; not the variables
    specllm sets for every template (RESERVED)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"{name} must be a dict of the chat template's variables (e.g. {{'enable_thinking': False}}), "
                        f"got {type(kwargs).__name__}")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise InvalidOptionError(f"{name}: {key!r} is not a name a template can read (letters, digits and _)")
        if key in RESERVED:
            raise InvalidOptionError(f"{name}: {key!r} is set for every template ({', '.join(RESERVED)}); leave it "
                                     "out")
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):  # "false" reads as true
        raise InvalidOptionError(f"{name}: enable_thinking must be true or false, got "
                                 f"{kwargs['enable_thinking']!r} (as llama-server requires)")
    return dict(kwargs)


def _compiled(template: str, where: str):
    import jinja2

    try:
        return _compile(template)
    except jinja2.TemplateError as e:
        raise InvalidOptionError(f"{where} is not a valid Jinja template ({e}); give chat_template= a Jinja "
                                 f"template or one of llama.cpp's built-in names (e.g. \"chatml\")") from None


def render(template: str, messages: List[dict], add_generation_prompt: bool, bos_token: str = "",
           eos_token: str = "", source: Optional[str] = None, tools: Optional[List[dict]] = None,
           kwargs: Optional[dict] = None) -> str:
    """The prompt `template` makes of `messages`, its own variables set from `kwargs`. Raises InvalidOptionError
    when the template does not parse or refuses the conversation (its raise_exception, e.g. "roles must
    alternate"); `source` names where the template came from, for the message."""
    import jinja2

    where = source or "the chat template"
    compiled = _compiled(template, where)
    try:
        return compiled.render(**(kwargs or {}), messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, tools=tools)
    except _TemplateRaised as e:
        raise InvalidOptionError(f"{where} refuses these messages: {e}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError,
            RecursionError) as e:  # ArithmeticError: {{ 1/0 }}, range(10**9) in the sandbox (OverflowError)
        raise InvalidOptionError(f"{where} failed on these messages ({type(e).__name__}: {e}); check the "
                                 f"messages' roles and order, or pass chat_template=") from None


def prompt_text(target, messages, add_generation_prompt: bool, chat_template: str, tools=None,
                kwargs: Optional[dict] = None) -> str:
    """LLM.apply_chat_template's work: `target` a Model (its template, BOS/EOS texts and llama.cpp's formatter).
    kwargs: the template's own variables (checked); llama.cpp's built-in formats have none and ignore them."""
    msgs = check_messages(messages)
    tools = check_tools(tools)
    template = "" if chat_template == LLAMA_CPP else chat_template or model_template(target, tools)
    if not is_jinja(template):  # llama.cpp's formatting of the model's template, a built-in name, or none (chatml)
        if chat_template and chat_template != LLAMA_CPP and not _core.chat_template_known(chat_template):
            raise unknown_template(chat_template)  # llama.cpp's word blamed "this model's chat template"
        if tools or any("tool_calls" in m for m in msgs):
            raise InvalidOptionError("tools and tool calls need a Jinja chat template (the model's own, or "
                                     "chat_template=); llama.cpp's built-in formats have none")
        return target.apply_chat_template([(m["role"], m["content"] or "") for m in msgs], add_generation_prompt,
                                          template)
    return render(template, msgs, add_generation_prompt, target.bos_text, target.eos_text,
                  "chat_template=" if chat_template else "the model's chat template", tools, kwargs)


def model_template(target, tools) -> str:
    """The model's own template for a conversation: with tools, the GGUF's tool_use template if it has one (Hermes 2
    Pro and 3 carry one beside the default); the default, or the tool_use one when there is no default (as
    llama-server chooses)."""
    return (target.tool_use_template if tools else "") or target.chat_template or target.tool_use_template


def check_load_args(chat_template, kwargs) -> tuple:
    """LLM(chat_template=..., chat_template_kwargs=...) checked before the model loads: (template, variables); a
    Jinja template must parse."""
    template = _text("chat_template", chat_template if chat_template is not None else "")
    kwargs = check_kwargs(kwargs)
    if is_jinja(template):
        _compiled(template, "chat_template=")
    elif template and template != LLAMA_CPP and not _core.chat_template_known(template):
        raise unknown_template(template)  # said before the load (specllm-cli serve: before its port is bound)
    return template, kwargs


def unknown_template(template: str) -> InvalidOptionError:
    return InvalidOptionError(f"chat_template={template[:200]!r} is neither a Jinja template nor one of llama.cpp's "
                              "built-in format names (e.g. \"chatml\", \"llama3\", \"gemma\")")


class ChatMethods:
    """LLM's chat-template methods: the template it formats conversations with (LLM(chat_template=...,
    chat_template_kwargs=...) or the model's own), apply_chat_template and chat."""

    def _set_chat_template(self, checked: tuple) -> None:
        """After the load: the LLM's template and variables, as check_load_args checked them (a built-in name is
        one llama.cpp knows)."""
        self._chat_template, self._chat_template_kwargs = checked

    @property
    def chat_template(self) -> str:
        """The chat template chat() formats with: LLM(chat_template=...) when given (a Jinja template or a
        built-in name), else the model's own (the GGUF's tokenizer.chat_template; "" if it has none)."""
        return self._chat_template or self._engine.target.chat_template

    def chat_template_for(self, tools: Optional[Sequence[dict]] = None) -> str:
        """The chat template a conversation with these tools is formatted with: chat_template, except that with
        tools a model that carries a tool_use template (tokenizer.chat_template.tool_use, as Hermes 2 Pro's and 3's
        GGUFs do) is formatted with that one, as llama-server does."""
        return self._chat_template or model_template(self._engine.target, tools)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            chat_template: str = "", tools: Optional[Sequence[dict]] = None,
                            chat_template_kwargs: Optional[dict] = None) -> str:
        """The prompt text of a conversation. chat_template: "" = the LLM's (LLM(chat_template=...), else the
        model's own: the GGUF's Jinja template, rendered as transformers, llama-cpp-python and llama-server --jinja
        render it; ChatML if it has none); a Jinja template; one of llama.cpp's built-in format names ("chatml",
        "llama3", ...); or "llama.cpp": llama.cpp's built-in formatting of the model's template (specllm's default
        before 2026-11-26, which left out e.g. Qwen2.5's default system message). tools (OpenAI's function
        definitions) and messages with tool_calls / tool_call_id are given to a Jinja template.
        chat_template_kwargs: the template's own variables (e.g. {"enable_thinking": False} for Qwen3's), over
        LLM(chat_template_kwargs=...); a variable the template does not read changes nothing. A template that does
        not parse or refuses the messages raises InvalidOptionError."""
        kwargs = dict(self._chat_template_kwargs, **check_kwargs(chat_template_kwargs))
        return prompt_text(self._engine.target, messages, add_generation_prompt,
                           _text("chat_template", chat_template or "") or self._chat_template, tools, kwargs)

    def chat(self, messages: Sequence[dict], *, stream: bool = False, chat_template_kwargs: Optional[dict] = None,
             tools: Optional[Sequence[dict]] = None, **options):
        """Reply to a conversation: messages ([{"role": "system" | "user" | "assistant", "content": ...}])
        formatted with the chat template (apply_chat_template, with chat_template_kwargs and tools), then completed;
        this is the conversation API, generate() and stream() complete raw text (as in llama-cpp-python).
        stream=True returns a Stream. The KV cache of the previous turns is reused when the new conversation
        extends the previous one. tools (OpenAI's function definitions) go to the template, so the model sees them;
        the reply is its text, calls included as the model writes them (the server's /v1/chat/completions returns
        them parsed as tool_calls, and constrains them to the tools' schemas)."""
        if "suffix" in options:  # generate's fill in the middle would take the templated conversation as its prefix
            raise TypeError("chat() takes no suffix: fill in the middle completes raw code, "
                            "generate(prefix, suffix=...) does it")
        prompt = self.apply_chat_template(messages, add_generation_prompt=True, tools=tools,
                                          chat_template_kwargs=chat_template_kwargs)
        return self.stream(prompt, **options) if flag("stream", stream) else self.generate(prompt, **options)
