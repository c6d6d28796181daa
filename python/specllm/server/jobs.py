"""What every generation endpoint does with its request (chat, completions, responses, messages, infill): check
that the server is ready and the model is this one, queue the job on the worker, follow its events (cancelling it
when the client goes away), and turn a failed generation into the API's error."""
from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Callable, Optional

from fastapi import Request

from ..errors import ContextOverflowError, InvalidOptionError, SpecLLMError
from . import protocol as p
from .errors import APIError
from .worker import Job, QueueFull, ServerStopping

DISCONNECT_POLL_S = 0.1


def model_id(name_or_path: str) -> str:
    """A model's id: a registry name as it is, a GGUF file's name without .gguf."""
    name = os.path.basename(name_or_path)
    return name[:-5] if name.endswith(".gguf") else name


def server_state(request: Request):
    """The app's State (app.py): the worker, the metrics, the model's id."""
    return request.app.state.specllm


def begin(request: Request, req: p.SamplingFields):
    """(state, start time) of a generation request whose model and fields were checked."""
    state = server_state(request)
    t0 = time.monotonic()
    state.require_ready()
    check_model(state, req)
    return state, t0


async def prepared(request: Request, fn: Callable, *args):
    """fn(*args) on the server's one preparing thread: a request's chat template and tokens, which a long text makes
    slow (llama.cpp tokenizes a word in time quadratic in its length), so that the event loop stays free for /health,
    streams and other clients meanwhile. One thread, first come first served: with no await between this and the
    job's submit, generation jobs reach the worker's queue in the order their requests came, as when this ran on the
    loop (an embedding request, tokenized by the worker, is queued at once). Ends as off_loop says."""
    state = server_state(request)
    if state.lane is None:
        state.lane = ThreadPoolExecutor(1, thread_name_prefix="specllm-prepare")
    lane = state.lane
    try:
        return await off_loop(request, lane, fn, *args)
    except asyncio.CancelledError:
        if state.lane is not lane:  # the server stopped (app.py's lifespan) while this request waited for the lane
            raise generation_error(ServerStopping()) from None
        raise


async def off_loop(request: Request, executor, fn: Callable, *args):
    """fn(*args) on executor's thread (None: the loop's default threads), awaited until it returns, the client goes
    away (a 499; not begun, fn is skipped: twelve clients' long messages left behind held a later 4-token request
    7 s) or the server begins to stop (a 503 at once: a request waiting behind seconds of tokenizing was cancelled by
    uvicorn 5 s later, answered a plain-text 500 and logged with a traceback). What fn still does then is dropped."""
    state = server_state(request)
    gone = threading.Event()

    def run():
        if gone.is_set():
            raise _Gone
        return fn(*args)

    async def watch() -> str:
        while True:
            if state.worker.stopping:
                return "stopping"
            if await request.is_disconnected():
                return "gone"
            await asyncio.sleep(DISCONNECT_POLL_S)

    future = asyncio.get_running_loop().run_in_executor(executor, run)
    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait({future, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not future.done():
            gone.set()
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # read: nothing logged for it
        watcher.cancel()
    if future.done():
        try:
            return future.result()
        except _Gone:
            raise client_gone() from None
    raise generation_error(ServerStopping()) if watcher.result() == "stopping" else client_gone()


class _Gone(Exception):
    """A request's client went away before its thread began it."""


def check_model_name(state, model) -> None:
    """A 404 unless the request names no model or this server's (every generation endpoint, /infill too)."""
    if model and model != state.model_id:
        shown = repr(model[:200] + ("..." if len(model) > 200 else "")) if isinstance(model, str) else repr(model)
        raise APIError(404, f"the model {shown} does not exist here; this server serves '{state.model_id}' "
                            "(GET /v1/models)", "invalid_request_error", "model", "model_not_found")


def check_model(state, req: p.SamplingFields) -> None:
    check_model_name(state, req.model)
    bad = p.unsupported(req)
    if bad:
        raise APIError(400, bad[1], "invalid_request_error", bad[0], "unsupported_parameter")


def bad_option(e: Exception) -> APIError:
    word = re.split(r"[\s:\[]", str(e), maxsplit=1)[0]  # "logit_bias: ...", "logit_bias[5] must ...": logit_bias
    param = word if word in p.ChatRequest.model_fields or word in p.CompletionRequest.model_fields else None
    return APIError(400, str(e), "invalid_request_error", param, "invalid_value")


def speculative(stats, job: Job, draft_length) -> p.Speculative:
    return p.Speculative(drafted_tokens=stats.n_drafted, accepted_tokens=stats.n_accepted,
                         acceptance_rate=round(stats.acceptance_rate, 4),
                         mean_accepted_per_step=round(stats.mean_accepted_per_step, 4), steps=stats.n_steps,
                         tokens_per_second=round(stats.tokens_per_second, 2),
                         speedup=round(stats.speedup, 3) if stats.speedup else None,
                         prompt_tokens_cached=stats.n_cached,
                         queue_ms=round(job.queue_ms, 1),
                         draft_length="auto" if draft_length is None else draft_length)  # 0 was "auto"


def submit(request: Request, tokens, opts, admitted: bool = False) -> Job:
    """A generation job on the worker's queue. admitted: a later choice or prompt of a request whose first job was
    queued, which the queue's cap does not refuse."""
    state = server_state(request)  # ready: begin checked it
    return enqueue(state, Job(tokens, opts, asyncio.get_running_loop(), state.metrics), admitted)


def enqueue(state, job: Job, admitted: bool = False) -> Job:
    """job on the worker's queue; a 429 when the queue is full (unless admitted), a 503 when the server is
    stopping."""
    try:
        state.worker.submit(job, admitted)
    except QueueFull:
        raise APIError(429, f"the server is busy: {state.max_queue} requests are already waiting; retry later",
                       "rate_limit_error", None, "queue_full", headers={"Retry-After": "2"}) from None
    except ServerStopping as e:
        raise generation_error(e) from None
    return job


async def watch_disconnect(request: Request, job: Job) -> None:
    while not job.cancelled:
        if await request.is_disconnected():
            job.cancel()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


def client_gone() -> APIError:
    """The answer to a request whose client went away before its job ran: nobody reads it (counted as a 499)."""
    return APIError(499, "the request was cancelled", "invalid_request_error", None, "cancelled")


def generation_error(e: BaseException) -> APIError:
    if isinstance(e, ServerStopping):
        return APIError(503, str(e), "server_error", None, "server_shutting_down")
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), "invalid_request_error", None, "context_length_exceeded")
    if isinstance(e, (InvalidOptionError, TypeError)):
        return bad_option(e)
    what = str(e) if isinstance(e, SpecLLMError) else type(e).__name__
    return APIError(500, f"the generation failed: {what}; the server goes on serving", "server_error", None,
                    "generation_failed")


async def follow(request: Request, job: Job, error: Callable[[BaseException], APIError] = None):
    """The job's events, (kind, value), until its "end"; an "error" event raises error(value) (generation_error's
    API error by default). Left before the end (an exception, a break, this handler cancelled, the client gone) the
    job is cancelled. Use it under contextlib.aclosing, so that a consumer that stops early ends it at once."""
    watcher = asyncio.create_task(watch_disconnect(request, job))
    ended = False
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                raise (error or generation_error)(value)
            if kind == "end":
                ended = True
                return
            yield kind, value
    finally:
        if not ended:
            job.cancel()
        watcher.cancel()


async def collect(request: Request, job: Job, tokens: Optional[list] = None):
    """(text, last chunk, logprobs) of a job, cancelling it if the client goes away; the generated tokens are added
    to `tokens` when it is given, the prompt's logprobs (when asked for) kept in job.prompt_logprobs. A 499 when
    the job never ran (its client went away while it waited)."""
    texts, last, logprobs = [], None, []
    async with aclosing(follow(request, job)) as events:
        async for _, value in events:
            texts.append(value.text)
            logprobs.extend(value.logprobs or [])
            if value.prompt_logprobs is not None:
                job.prompt_logprobs = value.prompt_logprobs
            if tokens is not None:
                tokens.extend(value.tokens)
            last = value
    if last is None:  # skipped while queued (job.cancel: the client went away)
        raise client_gone()
    return "".join(texts), last, logprobs
