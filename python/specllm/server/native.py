"""What llama-server's native endpoints (/completion and /infill) share: its sampling defaults and `samplers`
list, the parameters specllm refuses unless they are at their no-op value, its two limits on the generated text
(n_indent, t_max_predict_ms), and its answer (content, stop_type, timings...; not OpenAI's form), whole or streamed
as one `data:` event per step and a last one with "stop": true. n_predict 0 evaluates the prompt into the cache and
generates nothing (editor plugins send one when their ring of chunks changes, so that the next request finds it)."""
from __future__ import annotations

import json
import math
import time
from contextlib import aclosing
from typing import Callable, List, Optional, Union

from fastapi import Request
from pydantic import Field
from sse_starlette.sse import EventSourceResponse

from .. import _core
from ..errors import InvalidOptionError
from . import bias, jobs
from . import logprobs as lp
from .errors import APIError
from .protocol import _Request

# llama-server's sampling defaults, and each sampler's value when `samplers` leaves it out (it is not applied: a
# list without "temperature" samples at temperature 1, as llama.cpp's chain then ends in its dist sampler)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
SAMPLER_NAMES = {"temperature": "temperature", "temp": "temperature", "t": "temperature", "top_k": "top_k",
                 "top-k": "top_k", "k": "top_k", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p", "p": "top_p",
                 "min_p": "min_p", "min-p": "min_p", "m": "min_p", "penalties": "penalties", "e": "penalties"}
# llama.cpp's other samplers: a no-op at their defaults, which is all specllm takes (below); "infill" (i), which
# merges candidates sharing a prefix, is not applied
IGNORED_SAMPLERS = {"dry", "d", "typ_p", "typical_p", "typical", "y", "xtc", "x", "infill", "i",
                    "top_n_sigma", "s", "adaptive_p", "a"}
# the repetition penalties, llama-server's defaults (off, over the last 64 tokens), by generate()'s names
PENALTIES = {"repeat_penalty": ("repeat_penalty", 1.0), "presence_penalty": ("presence_penalty", 0.0),
             "frequency_penalty": ("frequency_penalty", 0.0), "repeat_last_n": ("penalty_last_n", 64)}


REFUSED = {"lora": None, "post_sampling_probs": False, "dry_multiplier": 0.0, "xtc_probability": 0.0,
           "typical_p": 1.0, "mirostat": 0}


class NativeFields(_Request):
    """The request fields both endpoints take."""
    model: Optional[str] = None
    n_predict: Optional[int] = Field(None, ge=-1)  # -1: until the end (of the middle) or of the context
    max_tokens: Optional[int] = Field(None, ge=-1)  # llama-server's alias
    temperature: Optional[float] = Field(None, ge=0)
    top_k: Optional[int] = Field(None, ge=0)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    min_p: Optional[float] = Field(None, ge=0, le=1)
    samplers: Union[List[str], str, None] = None
    seed: Optional[int] = None  # -1: random, as llama-server's
    stop: Union[str, List[str], None] = None
    n_indent: int = Field(0, ge=0)
    n_cache_reuse: Optional[int] = Field(None, ge=0)  # the server's --cache-reuse unless given
    t_max_predict_ms: int = 0
    stream: bool = False
    draft_length: Union[int, str, None] = None
    acceptance: Optional[str] = None
    repeat_penalty: Optional[float] = Field(None, gt=0)  # llama.cpp's repetition penalties over the last
    presence_penalty: Optional[float] = None            # repeat_last_n tokens of prompt and output
    frequency_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = Field(None, ge=-1, le=2**31 - 1)  # -1: the whole context, 0: off
    # what would change the output in a way specllm does not do: refused unless left at its no-op value
    n_probs: int = Field(0, ge=0)  # each token's logprob and the n most likely, in completion_probabilities
    lora: Optional[list] = None
    post_sampling_probs: bool = False
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    typical_p: float = 1.0
    mirostat: int = 0
    logit_bias: Optional[Union[list, dict]] = None  # bias.parse: llama-server's forms


def ready(request: Request):
    """The server's state once the model is loaded (a 503 while it loads)."""
    state = jobs.server_state(request)
    state.require_ready()
    return state


def begin(request: Request, req: NativeFields, refused: dict = REFUSED):
    """(the server's state, when the request came) once the model is loaded and named, or an error: 503 while
    loading, 404 for another model, 400 for a field set to what specllm does not do."""
    t0 = time.monotonic()
    state = ready(request)
    jobs.check_model_name(state, req.model)
    check_refused(req, request.url.path, refused)
    return state, t0


def check_refused(req, endpoint: str, defaults: dict = REFUSED) -> None:
    """A 400 naming the first field set to what specllm does not do."""
    for name, off in defaults.items():
        value = getattr(req, name)
        if value != off and not (off is None and not value):
            raise APIError(400, f"{name} is not supported by specllm's {endpoint}; leave it out",
                           "invalid_request_error", name, "unsupported_parameter")


def n_predict_of(req: NativeFields) -> int:
    return req.n_predict if req.n_predict is not None else req.max_tokens if req.max_tokens is not None else -1


def sampling(req: NativeFields) -> dict:
    """temperature, top_k, top_p, min_p and the repetition penalties as llama-server would sample this request: the
    penalties first, then top_k, top_p, min_p on the unscaled distribution and the temperature last (llama.cpp's
    default chain; specllm's own order scales first, which read min_p 0.05 as ~0.09 of the raw distribution at
    temperature 0.8). A `samplers` list that puts the temperature before the filters is taken in that order."""
    opts = {k: DEFAULTS[k] if getattr(req, k) is None else getattr(req, k) for k in DEFAULTS}
    penalties = {name: off if getattr(req, k) is None else getattr(req, k) for k, (name, off) in PENALTIES.items()}
    if req.samplers is None:
        return {**opts, **penalties, "temperature_last": True}
    names = list(req.samplers) if isinstance(req.samplers, str) else req.samplers
    used, order = set(), []
    for name in names:
        key = name.strip().lower()
        if key in SAMPLER_NAMES:
            used.add(SAMPLER_NAMES[key])
            order.append(SAMPLER_NAMES[key])
        elif key not in IGNORED_SAMPLERS:
            raise APIError(400, f"samplers: unknown sampler {name!r}; specllm applies penalties, temperature, top_k, "
                                "top_p and min_p (the others llama.cpp knows are no-ops here)", "invalid_request_error",
                           "samplers", "invalid_value")
    if "penalties" not in used:
        penalties = {name: off for name, off in PENALTIES.values()}
    filters = [i for i, k in enumerate(order) if k in ("top_k", "top_p", "min_p")]
    at = order.index("temperature") if "temperature" in order else len(order)
    if filters and filters[0] < at < filters[-1]:
        raise APIError(400, "samplers: the temperature between the filters (top_k, top_p, min_p) is an order "
                            "specllm cannot sample in; put it first or last", "invalid_request_error", "samplers",
                       "invalid_value")
    last = not filters or at > filters[-1]
    return {**{k: v if k in used else OFF[k] for k, v in opts.items()}, **penalties, "temperature_last": last}


class Limits:
    """llama-server's FIM limits on the generated text, as it arrives: n_indent > 0 ends the middle at the first
    line after the first that is indented less (cut where that line's text starts), t_max_predict_ms > 0 at a
    newline once generating has taken that long. feed() returns the text to pass on now: with n_indent, a line's
    indentation is held until its text shows whether it ends the middle, so a streamed middle is never taken back."""

    def __init__(self, n_indent: int, t_max_ms: int, clock=time.monotonic):
        self.n_indent, self.t_max_ms, self.clock = n_indent, t_max_ms, clock
        self.text = ""
        self.sent = 0      # characters passed on
        self.checked = 0   # the lines starting after the newlines before this index are decided
        self.stopped = False
        self.t0: Optional[float] = None

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if self.t0 is None:
            self.t0 = self.clock()
        self.text += text
        end = self._indented() if self.n_indent > 0 else len(self.text)
        if (not self.stopped and self.t_max_ms > 0 and "\n" in text
                and 1000.0 * (self.clock() - self.t0) > self.t_max_ms):
            self.stopped = True
        if self.stopped:
            end = len(self.text)
        out, self.sent = self.text[self.sent:end], end
        return out

    def rest(self) -> str:
        """What is still held when the generation ends."""
        out, self.sent = self.text[self.sent:], len(self.text)
        return out

    def _indented(self) -> int:
        """How much of the text is decided; cuts it and stops at a line indented less than n_indent."""
        while True:
            nl = self.text.find("\n", self.checked)
            if nl < 0:
                return len(self.text)
            start = pos = nl + 1
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos == len(self.text):
                return start  # the line's text has not come yet
            if pos - start < self.n_indent:
                self.text, self.stopped = self.text[:pos], True
                return pos
            self.checked = start


def stop_type(state, reason: str, limited: bool, tokens: List[int], stops, content: str) -> str:
    """"word" where a stop string follows the content in the generated tokens' text, "eos" for the rest of the stops
    (the end-of-generation token is not among the tokens: every reply with stops given said "word")."""
    if limited or reason == "length":
        return "limit"
    if reason == "stop":
        if stops and tokens:
            whole = state.llm.detokenize(tokens)
            if any(s and whole.startswith(s, len(content)) for s in stops):
                return "word"
        return "eos"
    return "none"


def final(state, req: NativeFields, settings: dict, content: str, stats, stop_type: str, job, truncated: bool):
    prefill_ms, gen_ms = stats.prefill_ms, stats.generate_ms
    n_eval = stats.n_prompt - stats.n_cached
    return {
        "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": state.model_id,
        "tokens_predicted": stats.n_generated, "tokens_evaluated": stats.n_prompt,
        "generation_settings": settings, "has_new_line": "\n" in content,
        "truncated": truncated,
        "stop_type": stop_type, "stopping_word": "", "tokens_cached": stats.n_prompt + stats.n_generated,
        "timings": {
            "cache_n": stats.n_cached, "prompt_n": n_eval, "prompt_ms": round(prefill_ms, 3),
            "prompt_per_token_ms": round(prefill_ms / n_eval, 3) if n_eval else 0.0,
            "prompt_per_second": round(1000.0 * n_eval / prefill_ms, 3) if prefill_ms > 0 else 0.0,
            "predicted_n": stats.n_generated, "predicted_ms": round(gen_ms, 3),
            "predicted_per_token_ms": round(gen_ms / stats.n_generated, 3) if stats.n_generated else 0.0,
            "predicted_per_second": round(stats.tokens_per_second, 3),
        },
        "speculative": jobs.speculative(stats, job, req.draft_length).model_dump(),
    }


async def run(request: Request, job, limits: Limits, warm: bool):
    """("text", text, logprob entries since the last text, tokens so far) as the limits pass it on, then ("end",
    None, last chunk, generated tokens); a generation error raises its APIError. Leaving early (the client went
    away) cancels the job."""
    last, generated, logprobs = None, [], []
    async with aclosing(jobs.follow(request, job)) as events:
        async for _, value in events:
            generated.extend(value.tokens)
            if value.finish_reason is not None:
                last = value
            if not warm and not limits.stopped:
                out = limits.feed(value.text)
                if limits.stopped:
                    job.stop()
                if value.finish_reason is not None:
                    out += limits.rest()
                logprobs.extend(value.logprobs or [])
                if out:
                    yield "text", out, logprobs, generated
                    logprobs = []
    if last is not None:
        yield "end", None, last, generated


def _fit(n_ctx: int, tokens: list, n_predict: int, warm: bool, prompt_param: str) -> int:
    """max_tokens for this prompt: n_predict, or what the context has left (-1); a 400 when it does not fit."""
    max_tokens = 0 if warm else n_predict if n_predict > 0 else n_ctx - len(tokens)
    if (max_tokens < 1 and not warm) or len(tokens) + max_tokens > n_ctx:
        wanted = f" + n_predict {n_predict}" if n_predict > 0 else ""
        raise APIError(400, f"the prompt ({len(tokens)} tokens){wanted} does not fit the context of {n_ctx} tokens; "
                            f"shorten it{' or lower n_predict' if n_predict > 0 else ''}", "invalid_request_error",
                       prompt_param, "context_length_exceeded")
    return max_tokens


async def answer(request: Request, state, req: NativeFields, prompts: List[list], endpoint: str, prompt_param: str,
                 extra: Optional[dict] = None, settings_extra: Optional[dict] = None,
                 body_extra: Optional[Callable] = None, return_tokens: bool = False, t0: Optional[float] = None,
                 logit_bias: Optional[dict] = None):
    """Generates from checked prompts (token lists) and answers in llama-server's form, whole or streamed: one
    prompt, its answer; several, one after another (each queued when the one before it ends, as /v1/completions'
    choices), the answers as a list in the prompts' order and a stream's events carrying their prompt's "index".
    extra: options beyond the sampling fields (a grammar); body_extra(index, generated tokens) -> fields for a final
    answer (the prompt's text); return_tokens: the generated token ids in "tokens"; t0: when the request came;
    logit_bias: req.logit_bias as bias.parse read it (its text keys tokenized with the prompt, off the event loop)."""
    t0 = time.monotonic() if t0 is None else t0
    n_predict = n_predict_of(req)
    warm = n_predict == 0  # the prompt into the cache, nothing generated (max_tokens 0: no step)
    opts = sampling(req)
    for key in ("stop", "draft_length", "acceptance"):
        if getattr(req, key) is not None:
            opts[key] = getattr(req, key)
    if req.seed is not None and req.seed >= 0:
        opts["seed"] = req.seed % 2**64
    opts["cache_reuse"] = req.n_cache_reuse if req.n_cache_reuse is not None else state.cache_reuse
    if logit_bias is None:
        logit_bias = bias.parse(state.llm, req.logit_bias)
    if logit_bias:
        opts["logit_bias"] = logit_bias
    if req.n_probs > 0:
        if req.n_probs > _core.max_top_logprobs:
            raise APIError(400, f"n_probs must be between 0 and {_core.max_top_logprobs}, got {req.n_probs}",
                           "invalid_request_error", "n_probs", "invalid_value")
        opts["logprobs"] = req.n_probs
    budgets = [_fit(state.llm.n_ctx, tokens, n_predict, warm, prompt_param) for tokens in prompts]
    try:
        state.llm.check_options(**dict(opts, max_tokens=budgets[0]))
    except (InvalidOptionError, TypeError) as e:
        raise jobs.bad_option(e) from None
    settings = {("repeat_last_n" if k == "penalty_last_n" else k): v for k, v in opts.items()
                if k != "temperature_last"}  # llama-server's chain order: no field of its settings
    settings["logit_bias"] = [{"token": t, "bias": b if b > -math.inf else None}  # llama-server's form (-inf: null)
                              for t, b in (logit_bias or {}).items()]
    settings.update(n_predict=n_predict, n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms,
                    **(settings_extra or {}))
    opts.update(extra or {})
    stops = [req.stop] if isinstance(req.stop, str) else req.stop
    first = jobs.submit(request, prompts[0], dict(opts, max_tokens=budgets[0]))  # a full queue: a 429 before a reply

    def start(index: int):
        """(job, its events) of prompt `index`, queued now (the first one already is)."""
        job = first if index == 0 else jobs.submit(request, prompts[index], dict(opts, max_tokens=budgets[index]),
                                                      admitted=True)
        limits = Limits(0 if warm else req.n_indent, 0 if warm else req.t_max_predict_ms)
        return job, limits, run(request, job, limits, warm)

    def probs(released, entries, text) -> dict:
        if req.n_probs <= 0:
            return {}
        return {"completion_probabilities": [probability(state.llm.token_bytes, e)
                                             for e in released.add(entries, text)]}

    def last_body(index, job, limits, content, last, generated):
        kind = "limit" if warm else stop_type(state, last.finish_reason, limits.stopped, generated, stops,
                                                     content)
        truncated = last.finish_reason == "length" and n_predict < 0  # the context is full
        body = final(state, req, settings, content, last.stats, kind, job, truncated)
        body["index"] = index
        if kind == "word":  # the stop string found where the content ends, in the text of every generated token
            whole = state.llm.detokenize(generated)
            body["stopping_word"] = next((s for s in stops if whole.startswith(s, len(content))), "")
        if return_tokens:
            body["tokens"] = [] if warm else list(generated)
        body.update(body_extra(index, generated) if body_extra else {})
        return body

    def observe():
        state.metrics.request_seconds.labels(endpoint=endpoint).observe(time.monotonic() - t0)

    if req.stream:
        async def sse():
            job, first_text = first, True
            try:
                for index, tokens in enumerate(prompts):
                    job, limits, events = start(index)
                    released = lp.Released(state.llm.token_bytes)  # a stop string's tokens (text cut) left out
                    text, sent = [], 0
                    async with aclosing(events):
                        async for kind, value, entries, generated in events:
                            if kind == "text":
                                if value and first_text:
                                    state.metrics.ttft_seconds.observe(time.monotonic() - t0)
                                    first_text = False
                                text.append(value)
                                ids = list(generated[sent:]) if return_tokens else []
                                sent = len(generated)
                                yield json.dumps({"index": index, "content": value, "tokens": ids, "stop": False,
                                                  "id_slot": 0, "tokens_predicted": len(generated),
                                                  "tokens_evaluated": len(tokens), **probs(released, entries, value)})
                            else:
                                body = last_body(index, job, limits, "".join(text), entries, generated)
                                body["content"], body["tokens"] = "", []
                                yield json.dumps(body)
                    if job.cancelled and not job.limited:  # the client went away: queue no more
                        break
            except APIError as e:
                yield json.dumps(e.body())
            finally:
                job.cancel()
                observe()
        return EventSourceResponse(sse(), ping=15, sep="\n")
    bodies, job = [], first
    try:
        for index in range(len(prompts)):
            job, limits, events = start(index)
            released = lp.Released(state.llm.token_bytes)
            text, entries = [], []
            async with aclosing(events):
                async for kind, value, more, generated in events:
                    if kind == "text":
                        text.append(value)
                        entries.extend(more)
                    else:
                        bodies.append(dict(last_body(index, job, limits, "".join(text), more, generated),
                                           **probs(released, entries, "".join(text))))
            if len(bodies) <= index:
                raise APIError(503, "the generation ended without a result (the server is stopping); retry",
                               "server_error", None, "generation_ended")
            if job.cancelled and not job.limited:  # the client went away: queue no more
                break
    finally:
        job.cancel()
    observe()
    return bodies[0] if len(bodies) == 1 else bodies


def probability(token_bytes, e) -> dict:
    """A token's entry in llama-server's completion_probabilities: id, text, bytes, logprob and the top ones."""
    def one(token, logprob):
        b = token_bytes(token)
        # the text without a part of a UTF-8 character (llama-server cuts it, validate_utf8); bytes has all of it
        return {"id": token, "token": b.decode("utf-8", errors="ignore"), "bytes": list(b), "logprob": logprob}
    return dict(one(e.token, e.logprob), top_logprobs=[one(t, v) for t, v in e.top])
