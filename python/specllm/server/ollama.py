"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version), for the desktop apps and
editor plugins that speak only Ollama's protocol (point them at http://127.0.0.1:8000 as they would at
http://localhost:11434). /api/chat is served as the chat request it amounts to (routes.prepare_chat: messages,
tools, tool_calls with their arguments as objects, `format` "json" or a JSON schema); /api/generate completes the
prompt in the chat template (`system`), as given (`raw`), or fills in the middle (`suffix`). Replies are streamed
by default, one JSON object a line (application/x-ndjson), the last with "done": true and Ollama's durations (ns)
and counts, plus specllm's `speculative` object; "stream": false gives that last object whole.

Sampling follows Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9) unless `options` says otherwise;
`repeat_penalty`, `repeat_last_n`, `presence_penalty` and `frequency_penalty` are applied when given (as llama.cpp
does, over the last repeat_last_n = 64 tokens of prompt and reply), none by default (Ollama's engines differ on
whether its documented repeat_penalty 1.1 applies); images, `template` and `context` are a 400. Load options (num_ctx,
num_gpu, num_thread...) are the server's and are ignored per request; errors are {"error": "..."}, as Ollama's."""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import time
from typing import Any, Dict, List, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, ValidationError

from .. import __version__
from ..errors import InvalidOptionError
from . import embeddings, jobs
from . import protocol as p
from . import routes
from . import tools as tool_calls
from .errors import UNION_TAG, APIError, SafeJSONResponse, json_text
from .protocol import _Request

router = APIRouter()
API_VERSION = "0.12.0"  # the Ollama API version whose endpoints and fields this module serves
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
            "stop": "stop", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
NAMED = {v: ["options", k] for k, v in SAMPLING.items()}
NO_OP = {"tfs_z": (1.0,), "typical_p": (1.0,), "mirostat": (0,)}
LOAD_OPTIONS = {"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "logits_all", "vocab_only",
                "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "mirostat_tau",
                "mirostat_eta", "penalize_newline"}


class _Common(_Request):
    model: str
    stream: bool = True
    format: Union[str, Dict[str, Any], None] = None
    options: Optional[Dict[str, Any]] = None
    keep_alive: Union[int, float, str, None] = None
    think: Union[bool, str, None] = None
    # specllm's own
    draft_length: Union[int, str, None] = None


class ChatRequest(_Common):
    messages: List[Dict[str, Any]] = Field(default_factory=list)
    tools: Optional[List[Dict[str, Any]]] = None


class GenerateRequest(_Common):
    prompt: str = ""
    suffix: Optional[str] = None
    system: Optional[str] = None
    template: Optional[str] = None
    context: Optional[List[int]] = None
    raw: bool = False
    images: Optional[List[str]] = None


def _bad(message: str, param: Optional[str] = None, status: int = 400) -> APIError:
    return APIError(status, message, "invalid_request_error", param, "invalid_value")


def _check_model(state, name: str) -> None:
    if name not in (state.model_id, f"{state.model_id}:latest"):
        raise _bad(f"model '{name}' not found; this server serves '{state.model_id}' (GET /api/tags)", "model", 404)


def _sampling(req: _Common) -> dict:
    """The chat request's sampling fields from Ollama's options (its defaults where they are not given)."""
    options = dict(req.options or {})
    out = dict(DEFAULTS)
    for key, value in options.items():
        if key in SAMPLING:
            out[SAMPLING[key]] = value
        elif key in NO_OP:
            if value not in NO_OP[key]:
                raise _bad(f"options.{key} {value!r} is not supported: specllm samples without it "
                           f"(leave it out, or {NO_OP[key][0]})", f"options.{key}")
        elif key not in LOAD_OPTIONS and key != "num_predict":
            raise _bad(f"options.{key} is not an option specllm knows", f"options.{key}")
    n = options.get("num_predict")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < -2):
        raise _bad(f"options.num_predict must be an int (-1: until the end), got {n!r}", "options.num_predict")
    out["max_tokens"] = n if isinstance(n, int) and n > 0 else None
    seed = out.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:
        del out["seed"]  # Ollama's -1: a fresh seed (another type is the chat request's 400)
    if req.draft_length is not None:
        out["draft_length"] = req.draft_length
    return out


def _format(fmt):
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise _bad(f"format must be \"json\" or a JSON schema, got {fmt!r:.60}", "format")


def _messages(items: List[dict]) -> List[dict]:
    out = []
    for i, m in enumerate(items):
        if m.get("images"):
            raise _bad(f"messages[{i}] has images: only text is supported", f"messages.{i}.images")
        msg = {"role": m.get("role"), "content": m.get("content") or ""}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise _bad(f"messages[{i}].tool_calls must be a list", f"messages.{i}.tool_calls")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise _bad(f"messages[{i}].tool_calls[{j}] needs function.name", f"messages.{i}.tool_calls.{j}")
                args = fn.get("arguments", {})
                msg["tool_calls"].append({"id": f"call_{i}_{j}", "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
        if m.get("role") == "tool" and isinstance(m.get("tool_name"), str):
            msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def _checked(model, **fields):
    """model(**fields), a 400 naming the field for a value it refuses (a role, a value out of range)."""
    try:
        return model(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(x) for x in err.get("loc", ()) if not UNION_TAG.match(str(x))]  # not pydantic's "stop.str"
        if loc and loc[0] in NAMED:  # as Ollama's request names a sampling field: in its options
            loc = NAMED[loc[0]] + loc[1:]
        where = ".".join(loc)
        got = repr(err.get("input"))
        got = f" (got {got if len(got) <= 80 else got[:77] + '...'})" if err.get("type") != "missing" else ""
        raise _bad(f"{where}: {err.get('msg', 'invalid value')}{got}", where or None) from None


def _chat(state, req: ChatRequest) -> p.ChatRequest:
    return _checked(p.ChatRequest, messages=_messages(req.messages), tools=req.tools or None,
                    response_format=_format(req.format), **_sampling(req))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _final(state, model: str, last, job, t0: float, draft_length) -> dict:
    s = last.stats
    return {"model": model, "created_at": _now(), "done": True,
            "done_reason": {"length": "length"}.get(last.finish_reason, "stop"),
            "total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
            "prompt_eval_count": s.n_prompt - s.n_cached, "prompt_eval_duration": int(s.prefill_ms * 1e6),
            "eval_count": s.n_generated, "eval_duration": int(s.generate_ms * 1e6),
            "speculative": jobs.speculative(s, job, draft_length).model_dump()}


def _ollama_calls(calls: List[dict]) -> List[dict]:
    return [{"function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in calls]


async def _answer(request: Request, state, t0, job, req: _Common, prepared, piece):
    """The reply, streamed as NDJSON lines or whole: piece(text, calls) is the body of one line."""
    model, draft_length = req.model, req.draft_length
    held = tool_calls.reply_stream(prepared.tools, prepared.forced)
    if not req.stream:
        text, last, _ = await jobs.collect(request, job)
        content, calls = tool_calls.reply_parts(prepared.tools, prepared.forced, text)
        state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
        return SafeJSONResponse(dict(_final(state, model, last, job, t0, draft_length), **piece(content, calls)))

    async def lines():
        watcher = asyncio.create_task(jobs.watch_disconnect(request, job))
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "error":
                    yield json.dumps({"error": jobs.generation_error(value).message}) + "\n"
                    break
                if kind == "end":
                    break
                done = value.finish_reason is not None
                text, calls = held.pass_on(value.text, done) if held else (value.text, [])
                if text or calls:
                    yield json_text(dict({"model": model, "created_at": _now(), "done": False},
                                        **piece(text, calls))) + "\n"
                if done:
                    yield json_text(dict(_final(state, model, value, job, t0, draft_length), **piece("", []))) + "\n"
        finally:
            watcher.cancel()
            job.cancel()
            state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _begin(request: Request, model: str):
    """(state, start time) of a request for this server's model, once it is ready."""
    state = jobs.server_state(request)
    state.require_ready()  # first: while the model loads, its name is not known yet
    _check_model(state, model)
    return state, time.monotonic()


@router.post("/api/chat")
async def chat(request: Request, req: ChatRequest):
    state, t0 = _begin(request, req.model)
    if not req.messages:  # Ollama's way to load a model: an empty chat
        return {"model": req.model, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                "done": True, "done_reason": "load"}
    prepared = await jobs.prepared(request, lambda: routes.prepare_chat(state, _chat(state, req)))
    job = jobs.submit(request, prepared.tokens, prepared.opts)

    def piece(text, calls):
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = _ollama_calls(calls)
        return {"message": message}
    return await _answer(request, state, t0, job, req, prepared, piece)


def _generate_prompt(state, req: GenerateRequest) -> tuple:
    """(prompt tokens, options) of a generate request: its prompt in the chat template (unless raw), or fill in the
    middle with suffix."""
    sampling = _sampling(req)
    max_tokens = sampling.pop("max_tokens")
    if req.suffix is not None:
        try:
            tokens = state.llm.infill_prompt(req.prompt, req.suffix, max_tokens=max_tokens or 256)
        except (InvalidOptionError, TypeError) as e:
            raise _bad(str(e), "suffix") from None
    elif req.raw or not state.llm.chat_template:
        try:
            tokens = state.llm.prompt_tokens(req.prompt)
        except (InvalidOptionError, TypeError) as e:  # a lone surrogate: text with no UTF-8 form
            raise _bad(str(e), "prompt") from None
    else:
        messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": req.prompt}]
        try:
            tokens = state.llm.prompt_tokens(state.llm.apply_chat_template(messages))
        except (InvalidOptionError, TypeError) as e:
            raise _bad(str(e), "prompt") from None
    fields = _checked(p.CompletionRequest, prompt="x", response_format=_format(req.format), **sampling)
    return tokens, routes.request_options(state, fields, len(tokens), max_tokens, None)


@router.post("/api/generate")
async def generate(request: Request, req: GenerateRequest):
    state, t0 = _begin(request, req.model)
    for param, given in (("images", req.images), ("template", req.template), ("context", req.context)):
        if given:
            raise _bad(f"{param} is not supported: send the whole prompt (and system) instead", param)
    if not req.prompt and req.suffix is None:  # Ollama's way to load a model
        return {"model": req.model, "created_at": _now(), "response": "", "done": True, "done_reason": "load"}
    tokens, opts = await jobs.prepared(request, _generate_prompt, state, req)
    job = jobs.submit(request, tokens, opts)
    prepared = routes.Chat(tokens, opts, None, "", None)
    return await _answer(request, state, t0, job, req, prepared, lambda text, calls: {"response": text})


def _details(state) -> dict:
    """What Ollama says of a model, from llama.cpp's description ("qwen2 1.5B Q4_K - Medium")."""
    desc = state.llm._engine.target.description
    family, _, rest = desc.partition(" ")
    size, _, quant = rest.partition(" ")
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family], "parameter_size": size,
            "quantization_level": quant}


def _card(state, path: Optional[str] = None, name: Optional[str] = None) -> dict:
    """/api/tags' entry of the chat model, or of the embedding model at path named name."""
    st = os.stat(path or state.llm.model_path)
    details = _details(state) if path is None else {"format": "gguf", "family": "", "families": []}
    name = name or state.model_id
    return {"name": f"{name}:latest", "model": f"{name}:latest",
            "modified_at": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat(),
            "size": st.st_size, "digest": f"{st.st_size:x}{int(st.st_mtime):x}", "details": details}


def _cards(state) -> list:
    """The chat model's entry and, with serve --embedding-model, the embedding model's (embeddings.py)."""
    path = state.llm.embedding_model
    ids = embeddings.names(state)  # one id when the embedding model's file has the chat model's name
    return [_card(state)] + ([] if path is None or len(ids) == 1 else [_card(state, path, ids[0])])


@router.get("/api/tags")
async def tags(request: Request):
    state = jobs.server_state(request)
    state.require_ready()
    return {"models": _cards(state)}


@router.get("/api/ps")
async def ps(request: Request):
    state = jobs.server_state(request)
    state.require_ready()
    card = _card(state)
    return {"models": [dict(card, expires_at="2099-01-01T00:00:00Z", size_vram=0, context_length=state.llm.n_ctx)]}


@router.post("/api/show")
async def show(request: Request, body: Dict[str, Any]):
    state = jobs.server_state(request)
    state.require_ready()
    name = body.get("model") or body.get("name")
    if not isinstance(name, str):
        raise _bad("model is required: the name /api/tags lists", "model")
    if state.llm.embedding_model is not None and name in (embeddings.names(state)[0],
                                                          f"{embeddings.names(state)[0]}:latest"):
        card = _cards(state)[1]  # the embedding model of serve --embedding-model: it embeds, nothing else
        return {"modelfile": "", "parameters": "", "template": "", "details": card["details"], "model_info": {},
                "capabilities": ["embedding"], "modified_at": card["modified_at"]}
    _check_model(state, name)
    details = _details(state)
    template = state.llm.chat_template
    capabilities = ["completion"] + (["tools"] if tool_calls.template_calls_tools(template) else []) + (
        ["insert"] if state.llm._engine.target.fim_tokens.get("mid", -1) >= 0 else [])
    return {"modelfile": "", "parameters": "\n".join(f"{k} {v}" for k, v in DEFAULTS.items()), "template": template,
            "details": details, "model_info": {"general.architecture": details["family"],
                                               f"{details['family']}.context_length": state.llm.n_ctx},
            "capabilities": capabilities, "modified_at": _card(state)["modified_at"]}


@router.get("/api/version")
async def version():
    return {"version": API_VERSION, "specllm": __version__}
