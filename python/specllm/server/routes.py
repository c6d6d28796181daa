"""OpenAI's chat and completions endpoints (and /v1/models, /health): each request is checked, turned into prompt
tokens and options, queued as a worker job (jobs.py), and answered from the job's events, as one JSON body or as
server-sent events (several choices, `n` or a list of prompts, run one after another: choices.py). A client that
goes away cancels its job, whether it is queued or running. prepare_chat is the
chat request's prompt and options, which /v1/responses and /v1/messages serve their requests as."""
from __future__ import annotations

import time
import uuid
from typing import Any, List, NamedTuple, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .. import chat_template as chat_templates
from .. import grammar
from ..errors import InvalidOptionError
from . import bias, choices, embeddings, jobs
from . import logprobs as lp
from . import protocol as p
from . import tools as tool_calls
from .errors import APIError

router = APIRouter()   # behind the API key, when there is one
public = APIRouter()   # /health
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
    return "".join(parts)


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
    for key in ("tool_call_id", "name"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out


def _messages(messages: List[p.Message]) -> List[dict]:
    if not messages:
        raise APIError(400, "messages must hold at least one message", "invalid_request_error", "messages",
                       "invalid_value")
    return [_message(m, i) for i, m in enumerate(messages)]


def request_options(state, req: p.SamplingFields, n_prompt: int, max_tokens: Optional[int],
                    logprobs: Optional[int], call_rules: tuple = (None, {})) -> dict:
    """The generation options of a request (a 400 for a bad one). call_rules: the tool calls' grammar and the
    options that make it lazy (tools.call_grammar)."""
    n_ctx = state.llm.n_ctx
    if n_prompt + (max_tokens or 1) > n_ctx:
        wanted = f" + max_tokens {max_tokens}" if max_tokens else ""
        raise APIError(400, f"this request needs {n_prompt} prompt tokens{wanted}, more than the model's context "
                            f"of {n_ctx} tokens; shorten the messages or lower max_tokens", "invalid_request_error",
                       "messages" if isinstance(req, p.ChatRequest) else "prompt", "context_length_exceeded")
    opts = {k: getattr(req, k) for k in GENERATE_FIELDS if getattr(req, k) is not None}
    if "seed" in opts:
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
    rules, param = _grammar(req)  # with tools, a response_format or grammar is a 400 here
    lazy = {}
    if call_rules[0] is not None:
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
    if isinstance(req, p.ChatRequest) and req.tools and req.tool_choice != "none":
        raise APIError(400, f"{param} cannot be combined with tools (a tool call is read from the reply's text): "
                            "leave out one of them, or set tool_choice \"none\"", "invalid_request_error", param,
                       "invalid_value")
    return (rules if rules is not None else req.grammar), param


def _longest_piece(llm) -> int:
    """Bytes of the vocabulary's longest token (read once per LLM): a text needs at least len / this many tokens."""
    if getattr(llm, "_longest_piece", None) is None:
        target = llm._engine.target
        llm._longest_piece = max(len(target.piece(t)) for t in range(target.n_vocab))
    return llm._longest_piece


def _tokens(state, prompt, param: str) -> list:
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
    calls: Anthropic's prefill, which llama-server continues too), or None."""
    last = messages[-1] if messages else None
    if last and last.get("role") == "assistant" and not last.get("tool_calls") and last.get("content") and any(
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
    try:
        return state.llm.apply_chat_template(messages, tools=tools, chat_template_kwargs=template_kwargs) + (
            prefill or "")
    except (InvalidOptionError, TypeError) as e:
        raise APIError(400, str(e), "invalid_request_error", "messages", "invalid_value") from None


def prepare_chat(state, req: p.ChatRequest, count_only: bool = False) -> Chat:
    """A chat request's prompt and options (a 400 for a bad one): /v1/chat/completions and /v1/responses.
    count_only: the prompt without the options (None), for the token-counting endpoints: a prompt longer than the
    context is what a client counts to find out, not an error there."""
    messages = _messages(req.messages)
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    try:
        tool_calls.check_names(req.tools)
    except ValueError as e:
        raise APIError(400, str(e), "invalid_request_error", "tools", "invalid_value") from None
    if tools and not tool_calls.template_calls_tools(state.llm.chat_template):
        raise APIError(400, "this model's chat template does not ask for tool calls in the <tool_call> format "
                            "(Qwen2.5, Hermes), the only one specllm parses", "invalid_request_error", "tools",
                       "unsupported_parameter")
    try:  # the reply begins with the opening, and its grammar makes the rest a call with valid arguments
        forced = tool_calls.forced_opening(req.tool_choice, tools)
        call_rules = tool_calls.call_grammar(req.tool_choice, tools,  # "auto": lazy, from "<tool_call>" on
                                             parallel=req.parallel_tool_calls is not False)
    except ValueError as e:
        raise APIError(400, str(e), "invalid_request_error", "tool_choice", "invalid_value") from None
    if prefill_of(messages) is not None and (forced or _grammar(req)[0] is not None):
        # the call's opening or the grammar would start where the prefilled reply already has
        raise APIError(400, "a reply begun in the last (assistant) message cannot be continued with "
                            f"{'a forced tool call' if forced else 'a grammar or a JSON response format'}: leave "
                            "out one of them", "invalid_request_error", "messages", "invalid_value")
    prompt = chat_prompt(state, messages, tools, req.chat_template_kwargs) + forced
    tokens = _tokens(state, prompt, "messages")
    if count_only:
        return Chat(tokens, None, tools, forced, None)
    n_logprobs = lp.chat_request(req)
    opts = request_options(state, req, len(tokens), req.max_completion_tokens or req.max_tokens, n_logprobs,
                           call_rules)
    return Chat(tokens, opts, tools, forced, n_logprobs)


@router.post("/v1/chat/completions", response_model=p.ChatCompletion)
async def chat_completions(request: Request, req: p.ChatRequest):
    state, t0 = jobs.begin(request, req)
    chat = await jobs.prepared(request, prepare_chat, state, req)
    tools, forced, n_logprobs = chat.tools, chat.forced, chat.n_logprobs
    runs = choices.plan([(chat.tokens, chat.opts)], req.n)
    first_job = jobs.submit(request, chat.tokens, chat.opts)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        def chunker(c: choices.Choice):
            held = tool_calls.reply_stream(tools, forced)

            def make_chunk(text, finish_reason, logprobs=None):
                calls = None
                if held is not None and (text is not None or finish_reason is not None):
                    text = held.feed(text or "")
                    if finish_reason is not None:
                        rest, calls = held.finish()
                        text += rest
                        finish_reason = "tool_calls" if calls and finish_reason == "stop" else finish_reason
                    if not text and finish_reason is None:
                        return None
                delta = p.Delta(content=text or None if calls else text, tool_calls=[
                    p.DeltaToolCall(index=i, **call) for i, call in enumerate(calls)] if calls else None)
                choice = p.ChunkChoice(index=c.index, delta=delta, finish_reason=None if calls else finish_reason,
                                       logprobs=lp.chat(logprobs, state.llm.token_bytes)
                                       if n_logprobs is not None and logprobs is not None else None)
                chunk = p.ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[choice])
                if not calls:
                    return chunk
                # the finish in a chunk of its own, as OpenAI sends it: the openai client's stream helper ends a
                # call's arguments (tool_calls.function.arguments.done) on the finish it reads before the call
                return [chunk, p.ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[
                    p.ChunkChoice(index=c.index, delta=p.Delta(), finish_reason=finish_reason)])]
            head = p.ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[
                p.ChunkChoice(index=c.index, delta=p.Delta(role="assistant", content=""))])
            return head, make_chunk
        return choices.respond_stream(request, first_job, runs, chunker, req)
    results = await choices.collect_all(request, first_job, runs)
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
    out = []
    for c, (text, last, logprobs) in zip(runs, results):
        logprobs = lp.Released(state.llm.token_bytes).add(logprobs, text)
        content, calls = tool_calls.reply_parts(tools, forced, text)  # content: the whole text when no calls
        finish = "tool_calls" if calls and last.finish_reason == "stop" else last.finish_reason
        message = p.ChatMessage(content=content or None, tool_calls=calls) if calls else p.ChatMessage(content=content)
        out.append(p.ChatChoice(index=c.index, message=message, finish_reason=finish, logprobs=lp.chat(
            logprobs, state.llm.token_bytes) if n_logprobs is not None else None))
    stats = [last.stats for _, last, _ in results]
    return p.ChatCompletion(id=rid, created=created, model=state.model_id, choices=out,
                            usage=choices.usage(runs, stats),
                            speculative=choices.speculative(stats, first_job, req.draft_length))


def _prompts(state, req: p.CompletionRequest) -> list:
    """(tokens, text) of a completions request's prompts: a text, a list of texts, token ids, or a list of token id
    lists (their text: the ids' text); with suffix, one text (fill in the middle)."""
    prompt = req.prompt
    if req.suffix is not None:  # fill in the middle: the prompt is the text before the insertion point
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise APIError(400, "with suffix, prompt must be the text before the insertion point (a string)",
                           "invalid_request_error", "prompt", "invalid_value")
        try:
            return [(state.llm.infill_prompt(prompt, req.suffix, max_tokens=req.max_tokens or 16), prompt)]
        except (InvalidOptionError, TypeError) as e:
            raise APIError(400, str(e), "invalid_request_error", "suffix", "invalid_value") from None
    several = isinstance(prompt, list) and bool(prompt) and all(isinstance(x, (str, list)) for x in prompt)
    prompts = prompt if several else [prompt]
    if len(prompts) > choices.MAX_CHOICES:
        raise APIError(400, f"at most {choices.MAX_CHOICES} prompts per request, got {len(prompts)}",
                       "invalid_request_error", "prompt", "invalid_value")
    out = []
    for i, one in enumerate(prompts):
        where = f" (prompt {i})" if several else ""
        if isinstance(one, list) and not all(isinstance(x, int) and not isinstance(x, bool) for x in one):
            raise APIError(400, f"prompt must be a text, a list of texts, token ids or a list of token id lists"
                                f"{where}", "invalid_request_error", "prompt", "invalid_value")
        if not one:
            raise APIError(400, f"prompt is empty{where}", "invalid_request_error", "prompt", "invalid_value")
        tokens = _tokens(state, one, "prompt")
        out.append((tokens, one if isinstance(one, str) else state.llm.detokenize(tokens)))
    return out


@router.post("/v1/completions", response_model=p.TextCompletion)
async def completions(request: Request, req: p.CompletionRequest):
    state, t0 = jobs.begin(request, req)
    n_logprobs = lp.completion_request(req)
    scored = bool(req.echo) and n_logprobs is not None  # the echoed prompt's tokens get logprobs too
    if scored and req.suffix is not None:
        raise APIError(400, "echo with logprobs scores the prompt as given, and with suffix the model reads a fill-in-"
                            "the-middle prompt instead; leave out one of them", "invalid_request_error", "suffix",
                       "unsupported_parameter")
    max_tokens = 16 if req.max_tokens is None else req.max_tokens

    def prepare():
        prompts = _prompts(state, req)
        return prompts, choices.plan([(t, request_options(state, req, len(t), max_tokens, n_logprobs))
                                      for t, _ in prompts], req.n)
    prompts, runs = await jobs.prepared(request, prepare)
    n = len(runs) // len(prompts)
    for c in runs:  # a prompt is scored once, by its first choice
        if scored and c.new_prompt:
            c.opts = dict(c.opts, prompt_logprobs=n_logprobs)
    echo = [prompts[c.index // n][1] if req.echo else "" for c in runs]  # the prompt's text before each choice
    first_job = jobs.submit(request, runs[0].tokens, runs[0].opts)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(c, text, finish_reason, body=None):
        return p.TextCompletion(id=rid, created=created, model=state.model_id, choices=[
            p.TextChoice(index=c.index, text=text or "", finish_reason=finish_reason, logprobs=body)])

    def with_prompt(c: choices.Choice, body: dict) -> dict:
        """body after the echoed prompt's logprobs, which the prompt's first choice scored (none if it was cancelled
        before that)"""
        first = runs[c.index - c.index % n]
        if first.prompt_logprobs is None:
            return body
        return lp.joined(lp.echoed(first.tokens, first.prompt_logprobs, state.llm.token_bytes, echo[c.index]), body)
    if req.stream:
        def chunker(c: choices.Choice):
            offset = [len(echo[c.index])]  # text_offset of the next token
            head = [scored]  # with logprobs the echoed prompt waits for its scores: it goes with the first chunk

            def make_chunk(text, finish_reason, logprobs=None, prompt_logprobs=None):
                body = None
                if n_logprobs is not None and logprobs is not None:
                    body = lp.completion(logprobs, state.llm.token_bytes, offset[0])
                    offset[0] += sum(len(t) for t in body["tokens"])
                if head[0] and text is not None:
                    head[0] = False
                    if prompt_logprobs is not None:
                        c.prompt_logprobs = prompt_logprobs
                    text = echo[c.index] + text
                    body = with_prompt(c, body or lp.completion([], state.llm.token_bytes))
                return chunk(c, text, finish_reason, body)
            return (chunk(c, echo[c.index], None) if echo[c.index] and not scored else None), make_chunk
        return choices.respond_stream(request, first_job, runs, chunker, req)
    results = await choices.collect_all(request, first_job, runs)
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
    out = []
    for c, (text, last, logprobs) in zip(runs, results):
        logprobs = lp.Released(state.llm.token_bytes).add(logprobs, text)
        body = None
        if n_logprobs is not None:
            body = lp.completion(logprobs, state.llm.token_bytes, len(echo[c.index]))
            if scored:
                body = with_prompt(c, body)
        out.append(p.TextChoice(index=c.index, text=echo[c.index] + text, finish_reason=last.finish_reason,
                                logprobs=body))
    stats = [last.stats for _, last, _ in results]
    return p.TextCompletion(id=rid, created=created, model=state.model_id, choices=out,
                            usage=choices.usage(runs, stats),
                            speculative=choices.speculative(stats, first_job, req.draft_length))


class TemplateRequest(p._Request):
    messages: List[p.Message]
    tools: Optional[List[Any]] = None
    chat_template_kwargs: Optional[dict] = None


@router.post("/apply-template")
async def apply_template(request: Request, req: TemplateRequest):
    """llama-server's /apply-template: the prompt a chat request's messages make in the server's chat template
    (with tools and chat_template_kwargs, as /v1/chat/completions makes it), nothing generated."""
    state = jobs.server_state(request)
    state.require_ready()
    messages = _messages(req.messages)
    return {"prompt": chat_prompt(state, messages, req.tools or None, req.chat_template_kwargs)}


@router.get("/v1/models", response_model=p.ModelList)
async def models(request: Request):
    state = jobs.server_state(request)
    if state.known_model_id is None:  # a function loads it and its id is not known yet: none to name
        if state.worker.load_error is not None:
            state.require_ready()  # the load failed: a 503 that says why, as /health
        return p.ModelList(data=[])
    ids = [state.model_id] + (embeddings.names(state)[:-1] if state.worker.ready else [])  # + an embedding model
    return p.ModelList(data=[p.ModelCard(id=i, created=state.created) for i in ids])


@router.get("/v1/models/{model:path}", response_model=p.ModelCard)
async def model(request: Request, model: str):
    state = jobs.server_state(request)
    if state.known_model_id is None:  # loading, its id not known yet: 503 until it is
        state.require_ready()
    if not (state.worker.ready and model in embeddings.names(state)):
        jobs.check_model_name(state, model or "(none)")
    return p.ModelCard(id=model, created=state.created)


@public.api_route("/health", methods=["GET", "HEAD"])  # HEAD: uptime monitors
async def health(request: Request):
    worker = jobs.server_state(request).worker
    if worker.load_error is not None:
        return JSONResponse({"status": "error", "error": str(worker.load_error)}, status_code=503)
    if not worker.ready:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})
    return {"status": "ok"}
