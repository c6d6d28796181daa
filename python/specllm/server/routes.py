"""OpenAI's chat and completions endpoints (and /v1/models, /health): each request is checked, turned into prompt
tokens and options, queued as a worker job (jobs.py), and answered from the job's events, as one JSON body or as
server-sent events (several choices, `n` or a list of prompts, run one after another: choices.py). A client that
goes away cancels its job, whether it is queued or running. A request's prompt and options are made in prepare.py."""
from __future__ import annotations

import time
import uuid
from typing import Any, List, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..errors import ContextOverflowError, InvalidOptionError
from . import choices, embeddings, jobs, prepare
from . import logprobs as lp
from . import protocol as p
from . import tools as tool_calls
from .errors import APIError, SafeJSONResponse

router = APIRouter()   # behind the API key, when there is one
public = APIRouter()   # /health


@router.post("/v1/chat/completions", response_model=p.ChatCompletion)
async def chat_completions(request: Request, req: p.ChatRequest):
    state, t0 = jobs.begin(request, req)
    chat = await jobs.prepared(request, prepare.prepare_chat, state, req)
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
            # content "" opens a text reply as OpenAI's; a reply that may be a call opens without it (null), or a
            # call-only reply read content '' through the openai client's stream helper and None whole
            head = p.ChatCompletionChunk(id=rid, created=created, model=state.model_id, choices=[
                p.ChunkChoice(index=c.index, delta=p.Delta(role="assistant", content=None if tools else ""))])
            return head, make_chunk
        return choices.respond_stream(request, first_job, runs, chunker, req)
    results = await choices.collect_all(request, first_job, runs)
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)

    def answer() -> p.ChatCompletion:
        out = []
        for c, (text, last, logprobs) in zip(runs, results):
            logprobs = lp.Released(state.llm.token_bytes).add(logprobs, text)
            content, calls = tool_calls.reply_parts(tools, forced, text)  # content: the whole text when no calls
            finish = "tool_calls" if calls and last.finish_reason == "stop" else last.finish_reason
            message = (p.ChatMessage(content=content or None, tool_calls=calls) if calls
                       else p.ChatMessage(content=content))
            out.append(p.ChatChoice(index=c.index, message=message, finish_reason=finish, logprobs=lp.chat(
                logprobs, state.llm.token_bytes) if n_logprobs is not None else None))
        stats = [last.stats for _, last, _ in results]
        return p.ChatCompletion(id=rid, created=created, model=state.model_id, choices=out,
                                usage=choices.usage(runs, stats),
                                speculative=choices.speculative(stats, first_job, req.draft_length))
    return await _answered(request, answer, n_logprobs)


async def _answered(request: Request, answer, n_logprobs: Optional[int]):
    """A whole answer; with logprobs, built and written as JSON on a thread: each token's alternatives are dicts of
    their own, and n = 8 choices of 1024 tokens with 20 alternatives (10 MB) held the event loop (other clients'
    streams, /health) 1.8-2.0 s."""
    if n_logprobs is None:
        return answer()

    def written():  # choice by choice: pydantic holds the GIL through a dump (all 8 at once: 0.6 s)
        body = answer()
        choices, body.choices = body.choices, []
        return SafeJSONResponse(dict(body.model_dump(mode="json"), choices=[c.model_dump(mode="json")
                                                                             for c in choices]))
    return await jobs.off_loop(request, None, written)


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
        except ContextOverflowError as e:
            raise APIError(400, str(e), "invalid_request_error", "max_tokens", "context_length_exceeded") from None
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
        tokens = prepare.tokens_of(state, one, "prompt")
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

    def ready():
        prompts = _prompts(state, req)
        return prompts, choices.plan([(t, prepare.request_options(state, req, len(t), max_tokens, n_logprobs))
                                      for t, _ in prompts], req.n)
    prompts, runs = await jobs.prepared(request, ready)
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
            offsets = lp.Offsets(len(echo[c.index]))  # where the next token's text begins
            head = [scored]  # with logprobs the echoed prompt waits for its scores: it goes with the first chunk

            def make_chunk(text, finish_reason, logprobs=None, prompt_logprobs=None):
                body = None
                if n_logprobs is not None and logprobs is not None:
                    body = lp.completion(logprobs, state.llm.token_bytes, offsets)
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

    def answer() -> p.TextCompletion:
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
    return await _answered(request, answer, n_logprobs)


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
    messages = prepare.messages_of(req.messages)
    return {"prompt": prepare.chat_prompt(state, messages, req.tools or None, req.chat_template_kwargs)}


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
