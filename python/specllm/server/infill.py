"""POST /infill: llama-server's code-completion endpoint, which editor plugins call (llama.vscode, llama.vim):
input_prefix, input_suffix, input_extra (other files' chunks, in the repo-level FIM form: specllm/infill.py) and
prompt (text the middle starts with), with llama-server's sampling defaults and its two FIM limits, n_indent and
t_max_predict_ms. The answer is llama-server's own form (content, stop_type, timings...), not OpenAI's; streamed,
one `data:` event per step and a last one with "stop": true. n_predict 0 evaluates the prompt into the cache and
generates nothing (the plugins send one when the ring of chunks changes, so that the next completion finds it)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import List, Optional, Union

from fastapi import APIRouter, Request
from pydantic import Field
from sse_starlette.sse import EventSourceResponse

from ..errors import InvalidOptionError
from . import jobs
from .errors import APIError
from .protocol import _Request

router = APIRouter()
ROOM = 256  # tokens kept free for the middle when n_predict is -1 (until the end of the middle or of the context)
# llama-server's sampling defaults, and each sampler's value when `samplers` leaves it out (it is not applied: a
# list without "temperature" samples at temperature 1, as llama.cpp's chain then ends in its dist sampler)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
SAMPLER_NAMES = {"temperature": "temperature", "temp": "temperature", "t": "temperature", "top_k": "top_k",
                 "top-k": "top_k", "k": "top_k", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p", "p": "top_p",
                 "min_p": "min_p", "min-p": "min_p", "m": "min_p"}
# llama.cpp's other samplers: a no-op at their defaults, which is all specllm takes (below); "infill" (i), which
# merges candidates sharing a prefix, is not applied
IGNORED_SAMPLERS = {"dry", "d", "typ_p", "typical_p", "typical", "y", "xtc", "x", "penalties", "e", "infill", "i",
                    "top_n_sigma", "s", "adaptive_p", "a"}


class ExtraChunk(_Request):
    text: str
    filename: str = "tmp"


class InfillRequest(_Request):
    model: Optional[str] = None
    input_prefix: str
    input_suffix: str
    input_extra: List[ExtraChunk] = []
    prompt: str = ""
    n_predict: Optional[int] = Field(None, ge=-1)  # -1: until the middle ends or the context is full
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
    # what would change the output in a way specllm does not do: refused unless left at its no-op value
    lora: Optional[list] = None
    n_probs: int = 0
    grammar: Optional[str] = None
    json_schema: Optional[dict] = None
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    typical_p: float = 1.0
    mirostat: int = 0
    logit_bias: Optional[Union[list, dict]] = None


def _refused(req: InfillRequest) -> Optional[str]:
    defaults = {"lora": None, "n_probs": 0, "grammar": None, "json_schema": None, "repeat_penalty": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
                "typical_p": 1.0, "mirostat": 0, "logit_bias": None}
    for name, off in defaults.items():
        value = getattr(req, name)
        if value != off and not (off is None and not value):
            return name
    return None


def _sampling(req: InfillRequest) -> dict:
    """temperature, top_k, top_p, min_p as llama-server would sample this request."""
    opts = {k: DEFAULTS[k] if getattr(req, k) is None else getattr(req, k) for k in DEFAULTS}
    if req.samplers is None:
        return opts
    names = list(req.samplers) if isinstance(req.samplers, str) else req.samplers
    used = set()
    for name in names:
        key = name.strip().lower()
        if key in SAMPLER_NAMES:
            used.add(SAMPLER_NAMES[key])
        elif key not in IGNORED_SAMPLERS:
            raise APIError(400, f"samplers: unknown sampler {name!r}; specllm applies temperature, top_k, top_p and "
                                "min_p (the others llama.cpp knows are no-ops here)", "invalid_request_error",
                           "samplers", "invalid_value")
    return {k: v if k in used else OFF[k] for k, v in opts.items()}


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


def _stop_type(state, reason: str, limited: bool, tokens: List[int], stops) -> str:
    if limited or reason == "length":
        return "limit"
    if reason == "stop":
        return "eos" if tokens and state.llm._engine.target.is_eog(tokens[-1]) or not stops else "word"
    return "none"


def _final(state, req: InfillRequest, settings: dict, content: str, stats, stop_type: str, job, truncated: bool):
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


@router.post("/infill")
async def infill(request: Request, req: InfillRequest):
    state = jobs.server_state(request)
    t0 = time.monotonic()
    state.require_ready()
    jobs.check_model_name(state, req.model)
    refused = _refused(req)
    if refused:
        raise APIError(400, f"{refused} is not supported by specllm's /infill; leave it out", "invalid_request_error",
                       refused, "unsupported_parameter")
    n_predict = req.n_predict if req.n_predict is not None else req.max_tokens if req.max_tokens is not None else -1
    warm = n_predict == 0  # the prompt into the cache, nothing generated (one token is, and dropped)
    try:
        tokens = state.llm.infill_prompt(req.input_prefix, req.input_suffix,
                                         max_tokens=n_predict if n_predict > 0 else min(ROOM, state.llm.n_ctx // 4),
                                         extra=[(c.filename, c.text) for c in req.input_extra], middle=req.prompt)
    except (InvalidOptionError, TypeError) as e:  # named by LLM.infill_prompt's argument: say the field's name
        word = str(e).split(" ", 1)[0]
        param = {"prompt": "input_prefix", "middle": "prompt", "extra": "input_extra"}.get(word, "input_suffix")
        raise APIError(400, f"{param}{str(e)[len(word):]}" if word in ("prompt", "suffix", "middle") else str(e),
                       "invalid_request_error", param, "invalid_value") from None
    opts = _sampling(req)
    for key in ("stop", "draft_length", "acceptance"):
        if getattr(req, key) is not None:
            opts[key] = getattr(req, key)
    if req.seed is not None and req.seed >= 0:
        opts["seed"] = req.seed % 2**64
    opts["cache_reuse"] = req.n_cache_reuse if req.n_cache_reuse is not None else state.cache_reuse
    opts["max_tokens"] = 1 if warm else n_predict if n_predict > 0 else state.llm.n_ctx - len(tokens)
    if opts["max_tokens"] < 1:
        raise APIError(400, f"the prompt fills the context of {state.llm.n_ctx} tokens", "invalid_request_error",
                       "input_prefix", "context_length_exceeded")
    try:
        state.llm.check_options(**opts)
    except (InvalidOptionError, TypeError) as e:
        raise jobs.bad_option(e) from None
    settings = {k: v for k, v in opts.items() if k != "max_tokens"}
    settings.update(n_predict=n_predict, n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms)
    job = jobs.submit(request, tokens, opts)
    limits = Limits(0 if warm else req.n_indent, 0 if warm else req.t_max_predict_ms)
    events = _run(request, job, limits, warm)
    stops = [req.stop] if isinstance(req.stop, str) else req.stop

    def final(content, last, generated):
        stop_type = _stop_type(state, last.finish_reason, limits.stopped, generated, stops)
        if warm:
            stop_type = "limit"
        truncated = last.finish_reason == "length" and n_predict < 0  # the context is full
        return _final(state, req, settings, content, last.stats, stop_type, job, truncated)

    if req.stream:
        async def sse():
            try:
                text = []
                async for kind, value, last, generated in events:
                    if kind == "text":
                        text.append(value)
                        yield json.dumps({"index": 0, "content": value, "tokens": [], "stop": False, "id_slot": 0,
                                          "tokens_predicted": len(generated), "tokens_evaluated": len(tokens)})
                    else:
                        body = final("".join(text), last, generated)
                        body["content"] = ""
                        yield json.dumps(body)
            except APIError as e:
                yield json.dumps(e.body())
            finally:
                job.cancel()
                state.metrics.request_seconds.labels(endpoint="/infill").observe(time.monotonic() - t0)
        return EventSourceResponse(sse(), ping=15, sep="\n")
    text = []
    async for kind, value, last, generated in events:
        if kind == "text":
            text.append(value)
        else:
            state.metrics.request_seconds.labels(endpoint="/infill").observe(time.monotonic() - t0)
            return final("".join(text), last, generated)
    raise APIError(503, "the generation ended without a result (the server is stopping); retry", "server_error",
                   None, "generation_ended")


async def _run(request: Request, job, limits: Limits, warm: bool):
    """("text", text, None, tokens so far) as the limits pass it on, then ("end", None, last chunk, generated tokens); a
    generation error raises its APIError. Leaving early (the client went away) cancels the job."""
    watcher = asyncio.create_task(jobs.watch_disconnect(request, job))
    last, generated = None, []
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                raise jobs.generation_error(value)
            if kind == "end":
                break
            generated.extend(value.tokens)
            if value.finish_reason is not None:
                last = value
            if not warm and not limits.stopped:
                out = limits.feed(value.text)
                if limits.stopped:
                    job.stop()
                if value.finish_reason is not None:
                    out += limits.rest()
                if out:
                    yield "text", out, None, generated
        if last is not None:
            yield "end", None, last, generated
    finally:
        if last is None:
            job.cancel()
        watcher.cancel()
