"""Several choices in one request: OpenAI's `n` (chat and completions) and a list of prompts (/v1/completions).
Each choice is one generation, queued on the worker after the one before it ends (its prompt's prefix is then in
the KV cache); with the request's seed s, choice i samples with seed s + i, so choice 0 is the reply a single request
gets. Streamed, every chunk carries its choice's index and the choices follow one another; the usage counts each
prompt once and the `speculative` object sums the choices' steps."""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, List, Optional

from fastapi import Request
from sse_starlette.sse import EventSourceResponse

from ..results import Stats
from . import jobs
from . import logprobs as lp
from . import protocol as p
from .errors import APIError, json_text
from .worker import Job

MAX_CHOICES = 128  # prompts x n in one request (OpenAI's limit on n)


@dataclass
class Choice:
    index: int
    tokens: list
    opts: dict
    new_prompt: bool  # the first choice of its prompt: its prompt tokens count in the usage
    prompt_logprobs: Optional[list] = None  # what its job scored of the prompt (collect_all), when asked for


def plan(prompts: list, n: Optional[int]) -> List[Choice]:
    """The choices of a request: for each (tokens, opts) of its prompts, n of them (index = prompt * n + j)."""
    n = 1 if n is None else n
    if n < 1 or len(prompts) * n > MAX_CHOICES:
        raise APIError(400, f"n must be between 1 and {MAX_CHOICES // max(1, len(prompts))} here (at most "
                            f"{MAX_CHOICES} completions per request, prompts x n), got {n}", "invalid_request_error",
                       "n", "invalid_value")
    out = []
    for tokens, opts in prompts:
        for j in range(n):
            seeded = dict(opts, seed=(opts["seed"] + j) % 2**64) if j and "seed" in opts else opts
            out.append(Choice(len(out), tokens, seeded, j == 0))
    return out


def total(stats: List[Stats]) -> Stats:
    """The choices' stats summed (counts and times), for the request's `speculative` object."""
    out = Stats()
    for s in stats:
        for f in dataclasses.fields(Stats):
            v = getattr(s, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and f.name != "seed":
                setattr(out, f.name, getattr(out, f.name) + v)
    return out


def usage(choices: List[Choice], stats: List[Stats]) -> p.Usage:
    prompt = sum(s.n_prompt for c, s in zip(choices, stats) if c.new_prompt)
    cached = sum(s.n_cached for c, s in zip(choices, stats) if c.new_prompt)
    generated = sum(s.n_generated for s in stats)
    return p.Usage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated,
                   prompt_tokens_details=p.PromptTokensDetails(cached_tokens=cached))


def speculative(stats: List[Stats], first_job: Job, draft_length) -> p.Speculative:
    return jobs.speculative(total(stats), first_job, draft_length)


async def collect_all(request: Request, first_job: Job, choices: List[Choice]) -> list:
    """(text, last chunk, logprobs) of every choice, one after another; the first's job is already queued. A client
    gone (a job cancelled) queues no more of them."""
    out = []
    for c in choices:
        job = first_job if c.index == 0 else jobs.submit(request, c.tokens, c.opts, admitted=True)
        out.append(await jobs.collect(request, job))
        c.prompt_logprobs = job.prompt_logprobs
        if job.cancelled:
            break
    return out


# make_chunk(text, finish_reason, logprobs=None) -> a chunk (or a list of them), or None while its text is held
# back; a job asked for the prompt's logprobs calls it once with prompt_logprobs=[...] too (its first chunk)
Chunker = Callable[[Choice], tuple]  # choice -> (a chunk to send before its text or None, make_chunk)


async def _events(request: Request, first_job: Job, choices: List[Choice], chunker: Chunker, include_usage: bool,
                  draft_length) -> AsyncIterator[str]:
    """The SSE data lines of the choices' jobs, one after another; leaving early (the client went away) cancels the
    running job and queues no more."""
    state = jobs.server_state(request)
    t0 = time.monotonic()
    first_text = True
    job, done, make_chunk = first_job, [], None
    try:
        for c in choices:
            if c.index > 0:
                try:
                    job = jobs.submit(request, c.tokens, c.opts, admitted=True)
                except APIError as e:
                    yield json.dumps(e.body())
                    break
            head, make_chunk = chunker(c)
            if head is not None:
                yield chunk_json(head)
            released = lp.Released(state.llm.token_bytes)  # logprobs go out with their text (a stop string's never)
            logprobs = []  # released with their text, not sent yet (the text is held: a tool call may be starting)
            failed = False
            while True:
                kind, value = await job.events.get()
                if kind == "error":
                    yield json.dumps(jobs.generation_error(value).body())
                    failed = True
                    break
                if kind == "end":
                    break
                if value.text and first_text:
                    state.metrics.ttft_seconds.observe(time.monotonic() - t0)
                    first_text = False
                logprobs.extend(released.add(value.logprobs, value.text))
                scored = {} if value.prompt_logprobs is None else {"prompt_logprobs": value.prompt_logprobs}
                chunk = (make_chunk(value.text, value.finish_reason, logprobs, **scored)
                         if value.text or value.finish_reason or scored else None)
                if chunk is not None:  # None: text held back (a tool call may be starting)
                    logprobs = []
                    for one in chunk if isinstance(chunk, list) else [chunk]:
                        yield chunk_json(one)
                if value.finish_reason is not None:
                    done.append(value.stats)
            if failed:
                break
        if include_usage and len(done) == len(choices):
            last = make_chunk(None, None)
            last.choices = []
            last.usage = usage(choices, done)
            last.speculative = speculative(done, first_job, draft_length)
            yield last.model_dump_json(exclude_none=True)
        yield "[DONE]"
    finally:
        job.cancel()
        state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)


def chunk_json(chunk) -> str:
    """A stream chunk's JSON: fields that are None left out, but each choice's finish_reason and logprobs written
    (null until set), as OpenAI writes them: clients that validate chunks strictly read them as required."""
    body = chunk.model_dump(exclude_none=True)
    for choice in body.get("choices", []):
        choice.setdefault("logprobs", None)
        choice.setdefault("finish_reason", None)
    return json_text(body)


def respond_stream(request: Request, first_job: Job, choices: List[Choice], chunker: Chunker,
                   req: p.SamplingFields) -> EventSourceResponse:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return EventSourceResponse(_events(request, first_job, choices, chunker, include_usage, req.draft_length),
                               ping=15, sep="\n")
