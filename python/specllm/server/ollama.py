"""Ollama's API (/api/chat, /api/generate; the model routes /, /api/tags, /api/show, /api/ps, /api/version are in
ollama_models.py), for the desktop apps and editor plugins that speak only Ollama's protocol (point them at
http://127.0.0.1:8000 as they would at http://localhost:11434). /api/chat is served as the chat request it amounts
to (prepare.prepare_chat: messages, tools, tool_calls with their arguments as objects, `format` "json" or a JSON
schema), the oldest messages dropped when the conversation does not fit (ollama_context.py); /api/generate completes
the prompt in the chat template (`system`), as given (`raw`), or fills in the middle (a non-empty `suffix`). Replies
are streamed by default, one JSON object a line (application/x-ndjson), the last with "done": true and Ollama's
durations (ns) and counts, plus specllm's `speculative` object; "stream": false gives that last object whole; with
`logprobs`, each line carries its tokens' logprobs (the whole reply's when not streamed).

How a request's fields and options are read (null as not given, Ollama's defaults, the options that change nothing
here, keep_alive and think) is ollama_request.py's. Images, `template` and `context` are a 400; load options (num_ctx,
num_gpu, num_thread...) are the server's and are ignored per request; errors are {"error": "..."}, as Ollama's."""
from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import List

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..errors import InvalidOptionError
from . import jobs
from . import logprobs as lp
from . import protocol as p
from . import prepare
from . import tools as tool_calls
from .errors import SafeJSONResponse, json_text
from .ollama_context import capped, fit_chat
from .ollama_models import check_model
from .ollama_models import router as models_router
from .ollama_request import (ChatRequest, GenerateRequest, bad, chat_fields, chat_request, checked, format_field,
                             keep_alive, messages, n_logprobs, sampling, think_kwargs)

router = APIRouter()
router.include_router(models_router)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _final(state, model: str, last, job, t0: float, draft_length) -> dict:
    s = last.stats
    return {"model": model, "created_at": _now(), "done": True,
            "done_reason": {"length": "length"}.get(last.finish_reason, "stop"),
            "total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
            # as Ollama since 0.3x (ollama#17943): every prompt token, and those read from the cache beside it
            "prompt_eval_count": s.n_prompt, "prompt_eval_cached_count": s.n_cached,
            "prompt_eval_duration": int(s.prefill_ms * 1e6),
            "eval_count": s.n_generated, "eval_duration": int(s.generate_ms * 1e6),
            "speculative": jobs.speculative(s, job, draft_length).model_dump()}


def _ollama_calls(calls: List[dict]) -> List[dict]:
    """The reply's tool calls as Ollama gives them (api/types.go ToolCall): arguments as an object, and the call's
    place among the reply's calls in function.index."""
    return [{"id": c["id"], "function": {"index": i, "name": c["function"]["name"],
                                         "arguments": json.loads(c["function"]["arguments"])}}
            for i, c in enumerate(calls)]


def _logprobs(entries, token_bytes) -> list:
    """Ollama's logprobs of some tokens (api/types.go Logprob): OpenAI chat's entries, top_logprobs left out when
    empty as Go's omitempty leaves it out."""
    out = lp.chat(entries, token_bytes)["content"]
    for e in out:
        if not e["top_logprobs"]:
            del e["top_logprobs"]
    return out


async def _answer(request: Request, state, t0, job, req, prepared, piece):
    """The reply, streamed as NDJSON lines or whole: piece(text, calls) is the body of one line."""
    model, draft_length = req.model, req.draft_length
    held = tool_calls.reply_stream(prepared.tools, prepared.forced)
    scored = prepared.n_logprobs is not None
    released = lp.Released(state.llm.token_bytes)  # logprobs go out with the text they belong to
    if not req.stream:
        text, last, entries = await jobs.collect(request, job)
        content, calls = tool_calls.reply_parts(prepared.tools, prepared.forced, text)
        state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
        body = dict(_final(state, model, last, job, t0, draft_length), **piece(content, calls))
        if scored:
            body["logprobs"] = _logprobs(released.add(entries, text), state.llm.token_bytes)
        return SafeJSONResponse(body)

    async def lines():
        watcher = asyncio.create_task(jobs.watch_disconnect(request, job))
        first_text = True
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "error":
                    yield json.dumps({"error": jobs.generation_error(value).message}) + "\n"
                    break
                if kind == "end":
                    break
                if value.text and first_text:
                    state.metrics.ttft_seconds.observe(time.monotonic() - t0)
                    first_text = False
                done = value.finish_reason is not None
                text, calls = held.pass_on(value.text, done) if held else (value.text, [])
                entries = released.add(value.logprobs, value.text) if scored else []
                extra = {"logprobs": _logprobs(entries, state.llm.token_bytes)} if entries else {}
                if text or calls or entries:
                    yield json_text(dict({"model": model, "created_at": _now(), "done": False},
                                         **piece(text, calls), **extra)) + "\n"
                if done:
                    yield json_text(dict(_final(state, model, value, job, t0, draft_length), **piece("", []))) + "\n"
        finally:
            watcher.cancel()
            job.cancel()
            state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _begin(request: Request, model: str, what: str):
    """(state, start time) of a request for this server's model, once it is ready."""
    state = jobs.server_state(request)
    state.require_ready()  # first: while the model loads, its name is not known yet
    check_model(state, model, what)
    return state, time.monotonic()


def _loaded(req, empty: bool, field: str, blank):
    """Ollama's answer to a request with no messages (prompt): the model loaded, or unloaded with keep_alive 0 (here
    it stays loaded: load options are the server's); None for a request with some."""
    seconds = keep_alive(req.keep_alive)  # checked whatever the request holds
    if not empty:
        return None
    return {"model": req.model, "created_at": _now(), field: blank, "done": True,
            "done_reason": "unload" if seconds == 0 else "load"}


@router.post("/api/chat")
async def chat(request: Request, req: ChatRequest):
    state, t0 = _begin(request, req.model, "chat")
    loaded = _loaded(req, not req.messages, "message", {"role": "assistant", "content": ""})
    if loaded is not None:  # Ollama's way to load (unload) a model: an empty chat
        return loaded
    fields, max_tokens = chat_fields(req, state.llm.chat_template)
    prepared = await jobs.prepared(request, fit_chat, state, messages(req.messages),
                                   lambda kept: chat_request(kept, fields), max_tokens, req.truncate)
    job = jobs.submit(request, prepared.tokens, prepared.opts)

    def piece(text, calls):
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = _ollama_calls(calls)
        return {"message": message}
    return await _answer(request, state, t0, job, req, prepared, piece)


def _generate_prompt(state, req: GenerateRequest) -> tuple:
    """(prompt tokens, options, logprobs asked for) of a generate request: its prompt in the chat template (unless
    raw), or fill in the middle with a suffix."""
    fields = sampling(req)
    max_tokens = fields.pop("max_tokens")
    kwargs = think_kwargs(req, state.llm.chat_template)
    n_ctx = state.llm.n_ctx
    try:
        if req.suffix:  # "": no suffix, as Ollama takes it. The prefix's start is cut to leave room for the reply
            param = "suffix"
            tokens = state.llm.infill_prompt(req.prompt, req.suffix, max_tokens=min(max_tokens or 256, n_ctx // 2))
        elif req.raw or not state.llm.chat_template:
            if req.system:  # nowhere to put it
                raise bad("system needs a chat template to go in, and this model has none: its prompt is sent as it "
                          "is; put the system text in the prompt", "system")
            param = "prompt"
            tokens = state.llm.prompt_tokens(req.prompt)
        else:
            turns = ([{"role": "system", "content": req.system}] if req.system else []) + [
                {"role": "user", "content": req.prompt}]
            param = "prompt"
            tokens = state.llm.prompt_tokens(prepare.chat_prompt(state, turns, None, kwargs))
    except (InvalidOptionError, TypeError) as e:  # no FIM tokens; a lone surrogate, which has no UTF-8 form
        raise bad(str(e), param) from None
    n = n_logprobs(req)
    fields = checked(p.CompletionRequest, prompt="x", response_format=format_field(req.format), **fields)
    return tokens, prepare.request_options(state, fields, len(tokens), capped(n_ctx, len(tokens), max_tokens), n), n


@router.post("/api/generate")
async def generate(request: Request, req: GenerateRequest):
    state, t0 = _begin(request, req.model, "generate")
    if req.raw and (req.template or req.system or req.context):
        raise bad("raw mode does not support template, system, or context", "raw")  # Ollama's words
    for param, given in (("images", req.images), ("template", req.template), ("context", req.context)):
        if given:
            raise bad(f"{param} is not supported: send the whole prompt (and system) instead", param)
    loaded = _loaded(req, not req.prompt and not req.suffix, "response", "")
    if loaded is not None:  # Ollama's way to load (unload) a model
        return loaded
    tokens, opts, n = await jobs.prepared(request, _generate_prompt, state, req)
    job = jobs.submit(request, tokens, opts)
    prepared = prepare.Chat(tokens, opts, None, "", n)
    return await _answer(request, state, t0, job, req, prepared, lambda text, calls: {"response": text})
