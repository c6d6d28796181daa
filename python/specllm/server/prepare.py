"""A chat or completion request made ready to queue: its messages in the chat template (a reply begun in the last
assistant message continued), its prompt tokens, and its generation options, each checked (a 400 naming the field
that is wrong). prepare_chat is what /v1/chat/completions, /v1/responses, /v1/messages and Ollama's /api/chat
serve their requests as; request_options the options of any request."""
from __future__ import annotations

from typing import List, NamedTuple, Optional

from .. import chat_template as chat_templates
from .. import grammar
from ..errors import InvalidOptionError
from . import bias, jobs
from . import logprobs as lp
from . import protocol as p
from . import tool_grammar
from . import tools as tool_calls
from .errors import APIError, json_text

GENERATE_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty",
                   "seed", "stop", "draft_length", "acceptance")


def _text_of(message: p.Message, i: int) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for j, part in enumerate(message.content):
        if part.type == "text" and part.text is None:
            raise APIError(400, f"messages[{i}].content[{j}] is a text part without its text: give it "
                                "{\"type\": \"text\", \"text\": \"...\"}", "invalid_request_error",
                           f"messages.{i}.content.{j}.text", "invalid_value")
        if part.type != "text":
            raise APIError(400, f"only text content parts are supported, messages[{i}].content[{j}] is of type "
                                f"{part.type!r}", "invalid_request_error", f"messages.{i}.content.{j}.type",
                           "unsupported_content")
        parts.append(part.text)
    return joined_parts(parts)


def joined_parts(texts: List[str]) -> str:
    """A message's text parts as one text for the template: a line break between each and the text before it (none
    while that is empty), as llama-server joins them for a template that reads text."""
    out = ""
    for text in texts:
        out += "\n" + text if out else text
    return out


def _message(m: p.Message, i: int) -> dict:
    """A request's message as the chat template gets it."""
    out = {"role": "system" if m.role == "developer" else m.role,
           "content": None if m.content is None and m.tool_calls else _text_of(m, i)}
    if m.tool_calls:
        for j, call in enumerate(m.tool_calls):
            fn = call.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise APIError(400, f"messages[{i}].tool_calls[{j}] needs a function with its name, as the reply "
                                    "gave it: {\"id\": ..., \"type\": \"function\", \"function\": {\"name\": "
                                    "\"...\", \"arguments\": \"{...}\"}}", "invalid_request_error",
                               f"messages.{i}.tool_calls.{j}.function", "invalid_value")
        out["tool_calls"] = [tool_calls.template_call(c) for c in m.tool_calls]
    for key in ("tool_call_id", "name", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out


def messages_of(messages: List[p.Message]) -> List[dict]:
    if not messages:
        raise APIError(400, "messages must hold at least one message", "invalid_request_error", "messages",
                       "invalid_value")
    return [_message(m, i) for i, m in enumerate(messages)]


def request_options(state, req: p.SamplingFields, n_prompt: int, max_tokens: Optional[int],
                    logprobs: Optional[int], call_rules: tuple = (None, {})) -> dict:
    """The generation options of a request (a 400 for a bad one). call_rules: the tool calls' grammar and the
    options that make it lazy (tool_grammar.call_grammar)."""
    n_ctx = state.llm.n_ctx
    if n_prompt + (1 if max_tokens is None else max_tokens) > n_ctx:  # 0: the prompt scored alone may fill it
        chat = isinstance(req, p.ChatRequest)
        limit = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
        wanted = f" + {limit} {max_tokens}" if max_tokens else ""
        raise APIError(400, f"this request needs {n_prompt} prompt tokens{wanted}, more than the model's context "
                            f"of {n_ctx} tokens; shorten the {'messages' if chat else 'prompt'}"
                            f"{f' or lower {limit}' if max_tokens else ''}", "invalid_request_error",
                       "messages" if chat else "prompt", "context_length_exceeded")
    opts = {k: getattr(req, k) for k in GENERATE_FIELDS if getattr(req, k) is not None}
    if opts.get("seed") == -1:  # llama-server's, the CLI's and Ollama's "a fresh seed" (it was the seed 2^64 - 1)
        del opts["seed"]
    elif "seed" in opts:
        opts["seed"] %= 2**64
    if req.repeat_last_n is not None:
        opts["penalty_last_n"] = req.repeat_last_n
    opts["max_tokens"] = max_tokens if max_tokens is not None else n_ctx - n_prompt
    opts["cache_reuse"] = req.n_cache_reuse if req.n_cache_reuse is not None else state.cache_reuse
    if logprobs is not None:
        opts["logprobs"] = logprobs
    logit_bias = bias.parse(state.llm, req.logit_bias)
    if logit_bias:
        opts["logit_bias"] = logit_bias
    try:  # checked now, so that a bad value is a 400 before the request is queued
        state.llm.check_options(**opts)
    except (InvalidOptionError, TypeError) as e:
        raise jobs.bad_option(e) from None
    rules, param = _grammar(req)  # with tools, a GBNF grammar is a 400 here
    lazy = {}
    if call_rules[0] is not None:
        if rules is not None:  # a JSON response format beside the tools: a call or that JSON
            call_rules = tool_grammar.call_or_format(call_rules, rules)
        (rules, lazy), param = call_rules, "tools"
    if rules is not None:
        try:  # parsed now: a grammar that is not one is the caller's 400
            state.llm.check_options(**opts, grammar=rules, **lazy)
        except (InvalidOptionError, TypeError) as e:
            raise APIError(400, str(e), "invalid_request_error", param, "invalid_value") from None
        opts["grammar"] = rules
        opts.update(lazy)
    return opts


def _grammar(req: p.SamplingFields) -> tuple:
    """(the GBNF a request asks the output to follow, or None; the parameter that asked): response_format
    json_object / json_schema, or specllm's own grammar (GBNF, as llama-server's)."""
    try:
        rules = grammar.response_format(req.response_format) if req.response_format is not None else None
    except InvalidOptionError as e:
        raise APIError(400, str(e), "invalid_request_error", "response_format", "invalid_value") from None
    if rules is not None and req.grammar is not None:
        raise APIError(400, "grammar and a JSON response_format cannot be combined: give one of them",
                       "invalid_request_error", "grammar", "invalid_value")
    if rules is None and req.grammar is None:
        return None, None
    param = "response_format" if rules is not None else "grammar"
    if isinstance(req, p.ChatRequest) and req.tools and req.tool_choice != "none" and rules is None:
        raise APIError(400, "grammar cannot be combined with tools (a tool call is read from the reply's text): "
                            "leave out one of them, or set tool_choice \"none\"", "invalid_request_error", param,
                       "invalid_value")
    return (rules if rules is not None else req.grammar), param


def _longest_piece(llm) -> int:
    """Bytes of the vocabulary's longest token (read once per LLM): a text needs at least len / this many tokens."""
    if getattr(llm, "_longest_piece", None) is None:
        target = llm._engine.target
        llm._longest_piece = max(len(target.piece(t)) for t in range(target.n_vocab))
    return llm._longest_piece


def tokens_of(state, prompt, param: str) -> list:
    n_ctx = state.llm.n_ctx
    if isinstance(prompt, str) and len(prompt) > 64 * n_ctx and len(prompt) > 2 * n_ctx * _longest_piece(state.llm):
        # far more than the context can hold whatever the tokenizer makes of it; tokenizing a long word is quadratic
        # and runs on the event loop (a fuzzer's 640k letters without a space: 19 s), so say so without trying
        raise APIError(400, f"{param}: the prompt has {len(prompt)} characters, far more than the model's context "
                            f"of {n_ctx} tokens can hold (its longest token is {_longest_piece(state.llm)} bytes); "
                            "shorten it", "invalid_request_error", param, "context_length_exceeded")
    try:
        return state.llm.prompt_tokens(prompt)
    except (InvalidOptionError, TypeError) as e:
        raise APIError(400, f"{param}: {e}", "invalid_request_error", param, "invalid_value") from None


class Chat(NamedTuple):
    """A checked chat request, ready to queue: its prompt tokens and options, the tools offered to the model (None
    if none are), and the text the reply was made to begin with (a forced tool call's opening, or "")."""
    tokens: list
    opts: dict
    tools: Optional[list]
    forced: str
    n_logprobs: Optional[int]


def prefill_of(messages: list) -> Optional[str]:
    """The start of the reply a conversation gives (its last message from the assistant, with text and no tool
    calls: Anthropic's prefill, which llama-server continues too; "" for an empty one: the reply from its start, not
    an empty turn and a new one), or None."""
    last = messages[-1] if messages else None
    if last and last.get("role") == "assistant" and not last.get("tool_calls") and isinstance(
            last.get("content"), str) and any(
            m.get("role") not in ("system", "developer") for m in messages[:-1]):  # alone, it is the conversation
        return last["content"]
    return None


def chat_prompt(state, messages: list, tools: Optional[list], kwargs: Optional[dict]) -> str:
    """The conversation in the server's chat template (a 400 naming the field that broke it). A conversation that
    ends with the start of the reply (prefill_of) is the conversation before it, the template's opening of a reply,
    and that start: the reply continues it (it was closed as a turn, and answered anew)."""
    prefill = prefill_of(messages)
    if prefill is not None:
        messages = messages[:-1]
    try:
        template_kwargs = chat_templates.check_kwargs(kwargs)
    except (InvalidOptionError, TypeError) as e:
        raise APIError(400, str(e), "invalid_request_error", "chat_template_kwargs", "invalid_value") from None

    def render(msgs):
        return state.llm.apply_chat_template(msgs, tools=tools, chat_template_kwargs=template_kwargs) + (prefill or "")
    try:
        return render(messages)
    except (InvalidOptionError, TypeError) as e:
        error = e
    as_text = _arguments_as_text(messages)
    if as_text is not None:  # a template that writes the calls' arguments as text (DeepSeek's adds them to strings)
        try:
            return render(as_text)
        except (InvalidOptionError, TypeError):
            pass
    raise APIError(400, str(error), "invalid_request_error", "messages", "invalid_value")


def _arguments_as_text(messages: list) -> Optional[list]:
    """The messages with their earlier calls' arguments as JSON text, as the request sent them (tools.template_call
    made them objects, which most templates write out with tojson), or None if none was made an object."""
    changed, out = False, []
    for m in messages:
        calls = m.get("tool_calls")
        if calls and any(isinstance(c.get("function"), dict) and isinstance(c["function"].get("arguments"), dict)
                         for c in calls):
            changed = True
            m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=json_text(
                c["function"]["arguments"]))) if isinstance(c.get("function"), dict) and isinstance(
                c["function"].get("arguments"), dict) else c for c in calls])
        out.append(m)
    return out if changed else None


def prepare_chat(state, req: p.ChatRequest, count_only: bool = False) -> Chat:
    """A chat request's prompt and options (a 400 for a bad one): /v1/chat/completions and /v1/responses.
    count_only: the prompt without the options (None), for the token-counting endpoints: a prompt longer than the
    context is what a client counts to find out, not an error there."""
    messages = messages_of(req.messages)
    # the template is given the tools whatever tool_choice says, as llama-server does ("none" only leaves the reply
    # free: the model still sees the tools it called before, and the conversation's cached prefix stays the same)
    offered = req.tools or None
    tools = offered if req.tool_choice != "none" else None
    try:
        tool_calls.check_names(req.tools)
    except ValueError as e:
        raise APIError(400, str(e), "invalid_request_error", "tools", "invalid_value") from None
    if offered and not tools and not tool_calls.template_calls_tools(state.llm.chat_template_for(offered)):
        offered = None  # "none" with a template that has no tools: left out, as before
    if tools and not tool_calls.template_calls_tools(state.llm.chat_template_for(tools)):
        raise APIError(400, "this model's chat template does not ask for tool calls in the <tool_call> format "
                            "(Qwen2.5, Hermes), the only one specllm parses", "invalid_request_error", "tools",
                       "unsupported_parameter")
    try:  # the reply begins with the opening (and its grammar, below, makes the rest a call with valid arguments)
        forced = tool_grammar.forced_opening(req.tool_choice, tools)
    except ValueError as e:
        raise APIError(400, str(e), "invalid_request_error", "tool_choice", "invalid_value") from None
    if prefill_of(messages) and (forced or _grammar(req)[0] is not None):
        # the call's opening or the grammar would start where the prefilled reply already has
        raise APIError(400, "a reply begun in the last (assistant) message cannot be continued with "
                            f"{'a forced tool call' if forced else 'a grammar or a JSON response format'}: leave "
                            "out one of them", "invalid_request_error", "messages", "invalid_value")
    prompt = chat_prompt(state, messages, offered, req.chat_template_kwargs) + forced
    tokens = tokens_of(state, prompt, "messages")
    if count_only:  # the tools' grammar is not needed to count
        return Chat(tokens, None, tools, forced, None)
    call_rules = tool_grammar.call_grammar(req.tool_choice, tools,  # "auto": lazy, from "<tool_call>" on
                                         parallel=req.parallel_tool_calls is not False)
    n_logprobs = lp.chat_request(req)
    opts = request_options(state, req, len(tokens), req.max_completion_tokens or req.max_tokens, n_logprobs,
                           call_rules)
    return Chat(tokens, opts, tools, forced, n_logprobs)
