"""What an Ollama /api/chat or /api/generate request asks for, read as Ollama reads it: a JSON null is a field not
given (LangChain's wrappers send every field and option they know, unset ones as null); options are a map whose
numbers Go decodes as float64 (so 2.0 is a good num_predict); options Ollama knows but specllm has no use for
(load options, old ones such as f16_kv, draft_num_predict) change nothing, and a name Ollama does not know either
is a 400 that suggests the nearest one (a typo would otherwise be silently ignored, as Ollama ignores it);
roles are lower-cased; keep_alive and think are checked as Ollama checks them (api/types.go).

Sampling follows Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9) unless `options` says otherwise;
`repeat_penalty`, `repeat_last_n`, `presence_penalty` and `frequency_penalty` are applied when given (as llama.cpp
does, over the last repeat_last_n = 64 tokens of prompt and reply), none by default (Ollama's engines differ on
whether its documented repeat_penalty 1.1 applies)."""
from __future__ import annotations

import difflib
import json
import logging
import re
from typing import Any, Dict, List, Optional, Union

from pydantic import Field, StrictInt, ValidationError, model_validator

from . import protocol as p
from .errors import UNION_TAG, APIError
from .protocol import _Request

log = logging.getLogger("specllm.server")

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
            "stop": "stop", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
NAMED = {v: ["options", k] for k, v in SAMPLING.items()}
INTEGERS = {"num_predict", "top_k", "seed", "repeat_last_n"}  # a float with no fraction is taken, as Go takes it
NO_OP = {"tfs_z": (1.0,), "typical_p": (1.0,), "mirostat": (0,)}  # accepted at the value that changes nothing
# every other name Ollama's Options and Runner have had (api/types.go's history, the ollama client's Options): load
# options, which are the server's, and options that no longer do anything or that specllm does not sample with
IGNORED = {"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
           "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "mirostat_tau", "mirostat_eta",
           "penalize_newline", "num_gqa", "rope_frequency_base", "rope_frequency_scale", "draft_num_predict"}
KNOWN = sorted(set(SAMPLING) | set(NO_OP) | IGNORED | {"num_predict"})
THINK_LEVELS = ("high", "medium", "low", "max")
_ignored_once: set = set()  # the ignored options already logged (once each: a client sends them every time)


class _Common(_Request):
    model: str
    stream: bool = True
    format: Union[str, Dict[str, Any], None] = None
    options: Optional[Dict[str, Any]] = None
    keep_alive: Any = None  # checked by keep_alive(): Go's duration strings or seconds
    think: Any = None       # checked by think()
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    # specllm's own
    draft_length: Union[int, str, None] = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data):
        """Ollama reads a JSON null as the field's absence (Go leaves the field at its zero value)."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class ChatRequest(_Common):
    messages: List[Dict[str, Any]] = Field(default_factory=list)
    tools: Optional[List[Dict[str, Any]]] = None
    truncate: bool = True  # false: a chat longer than the context is an error, not cut (Ollama's)


class GenerateRequest(_Common):
    prompt: str = ""
    suffix: Optional[str] = None
    system: Optional[str] = None
    template: Optional[str] = None
    context: Optional[List[StrictInt]] = None
    raw: bool = False
    images: Optional[List[str]] = None


def bad(message: str, param: Optional[str] = None, status: int = 400) -> APIError:
    return APIError(status, message, "invalid_request_error", param, "invalid_value")


def _integer(key: str, value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        raise bad(f"options.{key} must be an integer, got {value!r}", f"options.{key}")
    return value


def sampling(req: _Common) -> dict:
    """The chat request's sampling fields from Ollama's options (its defaults where they are not given), and
    max_tokens: num_predict, None for "until the end" (the caller caps it at what the context has left)."""
    options = {k: v for k, v in (req.options or {}).items() if v is not None}
    out = dict(DEFAULTS)
    for key, value in options.items():
        if key in INTEGERS:
            value = options[key] = _integer(key, value)
        if key in SAMPLING:
            out[SAMPLING[key]] = value
        elif key in NO_OP:
            if value not in NO_OP[key]:
                raise bad(f"options.{key} {value!r} is not supported: specllm samples without it "
                          f"(leave it out, or {NO_OP[key][0]})", f"options.{key}")
        elif key in IGNORED:
            if key not in _ignored_once:
                _ignored_once.add(key)
                log.info("Ollama API: options.%s is ignored (load options are the server's; the others change "
                         "nothing here)", key)
        elif key != "num_predict":
            near = difflib.get_close_matches(key, KNOWN, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise bad(f"options.{key} is not an option Ollama or specllm knows{hint}", f"options.{key}")
    n = options.get("num_predict")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < -2):
        raise bad(f"options.num_predict must be an int (-1: until the end), got {n!r}", "options.num_predict")
    out["max_tokens"] = n if isinstance(n, int) and n > 0 else None
    seed = out.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:
        del out["seed"]  # Ollama's -1: a fresh seed (another type is the chat request's 400)
    if req.draft_length is not None:
        out["draft_length"] = req.draft_length
    return out


def n_logprobs(req: _Common) -> Optional[int]:
    """How many top logprobs the request asks for with each token's, None for no logprobs (Ollama >= 0.12.11)."""
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise bad("top_logprobs must be between 0 and 20", "top_logprobs")  # Ollama's words
    return (req.top_logprobs or 0) if req.logprobs else None


# Go's time.ParseDuration: decimal numbers, each with its unit ("1h30m", "-1.5s", ".5h"), or "0"
_PART = r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def keep_alive(value) -> Optional[float]:
    """Seconds of keep_alive (negative: forever), None if not given; a 400 for what Ollama refuses. The model stays
    loaded whatever it says: load options are the server's."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise bad(f"keep_alive: Unsupported type: '{type(value).__name__}' (give a duration such as \"5m\", or "
                  "seconds as a number)", "keep_alive")
    if re.fullmatch(r"[-+]?0", value):
        return 0.0
    if re.fullmatch(rf"[-+]?({_PART})+", value):
        seconds = sum(float(n) * _UNITS[u] for n, u in re.findall(_PART, value))
        return -seconds if value.startswith("-") else seconds
    why = "missing unit in duration" if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", value) else "invalid duration"
    raise bad(f"keep_alive: time: {why} {json.dumps(value)} (give a duration such as \"5m\", or seconds as a "
              "number; negative: keep the model loaded)", "keep_alive")


def thinks(template: Optional[str]) -> bool:
    """Whether the chat template is a thinking model's: it has a switch for thinking (Qwen3's enable_thinking) or
    writes <think> (DeepSeek-R1's, Qwen3's)."""
    return bool(template) and ("enable_thinking" in template or "<think>" in template)


def think_kwargs(req: _Common, template: Optional[str]) -> Optional[dict]:
    """The chat_template_kwargs `think` asks for (think false: {"enable_thinking": False} on a thinking model); a 400
    for a value Ollama refuses, and for thinking asked of a model that does not think."""
    value = req.think
    if value is None:
        return None
    if isinstance(value, str) and value not in THINK_LEVELS:
        raise bad(f"invalid think value: {json.dumps(value)} (must be \"high\", \"medium\", \"low\", \"max\", true, "
                  "or false)", "think")
    if not isinstance(value, (bool, str)):
        raise bad("think must be a boolean or string (\"high\", \"medium\", \"low\", \"max\", true, or false)",
                  "think")
    if not thinks(template):
        if value is not False:
            raise bad(f"{json.dumps(req.model)} does not support thinking", "think")
        return None
    return {"enable_thinking": False} if value is False else None


def format_field(fmt):
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad(f"format must be \"json\" or a JSON schema, got {fmt!r:.60}", "format")


def messages(items: List[dict]) -> List[dict]:
    """Ollama's messages as the chat request's: roles lower-cased (as Ollama does), tool calls with their arguments
    as JSON text, a tool result's tool_name as its name."""
    out = []
    for i, m in enumerate(items):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with a role and its content", f"messages.{i}")
        if m.get("images"):
            raise bad(f"messages[{i}] has images: only text is supported", f"messages.{i}.images")
        role = m.get("role")
        msg = {"role": role.lower() if isinstance(role, str) else role, "content": m.get("content") or ""}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise bad(f"messages[{i}].tool_calls must be a list", f"messages.{i}.tool_calls")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad(f"messages[{i}].tool_calls[{j}] needs function.name", f"messages.{i}.tool_calls.{j}")
                args = fn.get("arguments")
                args = {} if args is None else args
                msg["tool_calls"].append({"id": f"call_{i}_{j}", "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
        if msg["role"] == "tool" and isinstance(m.get("tool_name"), str):
            msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def checked(model, **fields):
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
        raise bad(f"{where}: {err.get('msg', 'invalid value')}{got}", where or None) from None


def chat_fields(req: ChatRequest, template: Optional[str]) -> tuple:
    """(the chat request's fields but its messages and max_tokens, num_predict): the caller builds the request with
    p.ChatRequest(messages=..., **fields) and sets max_tokens once it knows the prompt's length."""
    fields = sampling(req)
    max_tokens = fields.pop("max_tokens")
    n = n_logprobs(req)
    if n is not None:
        fields.update(logprobs=True, top_logprobs=n)
    kwargs = think_kwargs(req, template)
    if kwargs:
        fields["chat_template_kwargs"] = kwargs
    return dict(fields, tools=req.tools or None, response_format=format_field(req.format)), max_tokens


def chat_request(messages_: List[dict], fields: dict) -> p.ChatRequest:
    return checked(p.ChatRequest, messages=messages_, **fields)
