"""A Responses API request (/v1/responses, responses.py) as the chat request it amounts to: `instructions` the
system message, the `input` items messages (a `function_call` item joins the assistant's message as a tool call, a
`function_call_output` item is the tool's message, `reasoning` items are left out), function `tools` the chat's
tools, `text.format` the chat's response_format, `max_output_tokens` max_tokens. What cannot be served is a 400
that names the field; hosted tools are skipped (logged), as llama-server skips them."""
from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Callable, Dict, List, Literal, Optional, Union

from pydantic import Field, ValidationError

from . import protocol as p
from .errors import APIError
from .prepare import joined_parts

log = logging.getLogger("specllm.server")


class ResponsesRequest(p.OwnFields):  # specllm's own fields, as on /v1/chat/completions
    model: Optional[str] = None
    input: Union[str, List[Dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)  # OpenAI's range
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stream: bool = False
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Any] = None
    text: Optional[Dict[str, Any]] = None
    parallel_tool_calls: Optional[bool] = None
    metadata: Optional[Dict[str, Any]] = None
    truncation: Optional[Literal["auto", "disabled"]] = None  # "auto": the oldest items dropped to fit (responses.py)
    store: Optional[bool] = None  # True by default, as OpenAI's: the response is kept (response_store.py)
    previous_response_id: Optional[str] = None
    # refused: specllm keeps no conversations, runs no background jobs, gives no logprobs here
    conversation: Optional[Any] = None
    background: Optional[bool] = None
    prompt: Optional[Any] = None
    top_logprobs: Optional[int] = None
    include: Optional[List[str]] = None
    seed: Optional[int] = None
    stop: Union[str, List[str], None] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None  # llama-server's, as on /v1/chat/completions


def bad(message: str, param: Optional[str], code: str = "invalid_value") -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def _refuse(req: ResponsesRequest) -> None:
    keep = ("specllm keeps no conversations: send the earlier items in input, or the id of the last response as "
            "previous_response_id")
    checks = [
        ("conversation", req.conversation, f"conversation cannot be followed; {keep}"),
        ("background", req.background, "background responses are not supported: leave out background"),
        ("prompt", req.prompt, "stored prompt templates are not supported: send the instructions and input"),
        ("top_logprobs", req.top_logprobs, "logprobs are not given on /v1/responses; /v1/chat/completions gives them"),
        ("include", "message.output_text.logprobs" in (req.include or []),
         "logprobs are not given on /v1/responses; /v1/chat/completions gives them"),
    ]
    for param, given, message in checks:
        if given:
            raise bad(message, param, "unsupported_parameter")
    _check_metadata(req.metadata)


def _check_metadata(metadata: Optional[dict]) -> None:
    """OpenAI's bounds on metadata, which a kept response holds (256 of them: 4 MB each grew the server by 1 GB)."""
    if not metadata:
        return
    if len(metadata) > 16:
        raise bad(f"metadata has {len(metadata)} keys; at most 16", "metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise bad(f"metadata key {key[:40]!r}... is {len(key)} characters long; at most 64", "metadata")
        if not isinstance(value, str) or len(value) > 512:
            raise bad(f"metadata[{key!r}] must be a string of at most 512 characters", f"metadata.{key}")


def _name(where: str) -> str:
    """A parameter's path as the messages write it: input.0.content -> input[0].content."""
    return re.sub(r"\.(\d+)", r"[\1]", where)


def _text(content, where: str, types=("input_text", "output_text")) -> str:
    """The text of an item's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{_name(where)} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in types and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise bad(f"only text is supported: {_name(where)}[{j}] is of type '{kind}'", f"{where}.{j}.type",
                       "unsupported_content")
        else:
            raise bad(f"{_name(where)}[{j}] must be a text part ({{'type': 'input_text', 'text': ...}}), got "
                       f"{part!r:.80}", f"{where}.{j}")
    return joined_parts(texts)


def resolved(given: Union[str, List[Dict[str, Any]]], lookup: Callable[[str], Optional[dict]]):
    """The input with each item_reference replaced by the kept item it names (lookup: an id's item or None)."""
    if isinstance(given, str):
        return given
    out = []
    for i, item in enumerate(given):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            ref = item.get("id")
            found = lookup(ref) if isinstance(ref, str) else None
            if found is None:
                raise bad(f"input[{i}] refers to the item {ref!r}, which is not kept here: specllm keeps the items "
                          "of its last responses (not with store: false) until it stops; send the item itself",
                          f"input.{i}.id", "not_found")
            item = found
        out.append(item)
    return out


_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def listed(given: Union[str, List[Dict[str, Any]]]) -> List[dict]:
    """The input's items as GET /v1/responses/{id}/input_items lists them: each with an id, a message's content as
    parts (input_text, or output_text for the assistant's)."""
    items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    out = []
    for item in items:
        item = dict(item, type=item.get("type") or "message")
        item.setdefault("id", f"{_PREFIX.get(item['type'], 'item')}_{uuid.uuid4().hex}")
        if item["type"] == "message":
            if isinstance(item.get("content"), str):
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": kind, "text": item["content"]}]
            item.setdefault("status", "completed")
        out.append(item)
    return out


def conversation_of(given: Union[str, List[Dict[str, Any]]], prior: List[dict]) -> List[dict]:
    """The conversation of a request: the previous response's (prior), then the input's messages (item references
    resolved)."""
    messages = prior
    if isinstance(given, str):
        return messages + [{"role": "user", "content": given}]
    for i, item in enumerate(given):
        kind, role, where = item.get("type"), item.get("role"), f"input.{i}"
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if kind in (None, "message") and role is None:
            raise bad(f"input[{i}] is a message without a role: give role 'user', 'system', 'developer' or "
                       "'assistant'", f"{where}.role")
        if kind in (None, "message"):
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"input[{i}].role must be 'user', 'system', 'developer' or 'assistant', got {role!r}",
                           f"{where}.role")
            text = _text(item.get("content"), f"{where}.content")
            if last is not None and role == "assistant":  # the assistant's message goes on
                last["content"] = (last["content"] or "") + text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise bad(f"input[{i}] (a function_call) needs {key} as a string", f"{where}.{key}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if last is None:
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad(f"input[{i}] (a function_call_output) needs call_id as a string", f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":  # a reasoning model's thoughts, sent back by agents: not part of the prompt
            continue
        else:
            raise bad(f"input[{i}] of type {kind!r} is not supported: give messages ({{'role': ..., 'content': "
                       "...}), function_call and function_call_output items", f"{where}.type", "unsupported_content")
    return messages


def _tools(req: ResponsesRequest) -> List[dict]:
    """The request's function tools, as the chat's tools. Hosted tools are skipped (logged), as llama-server does."""
    out = []
    for i, t in enumerate(req.tools or []):
        if t.get("type") != "function":
            log.warning("/v1/responses: tools[%d] of type %r is not offered to the model (function tools only)",
                        i, t.get("type"))
            continue
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise bad(f"tools[{i}] needs a name (a function tool: {{'type': 'function', 'name': ..., "
                       "'parameters': {...}}})", f"tools.{i}.name")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad(f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}, got "
               f"{choice!r:.80}", "tool_choice")


def _format(text: Optional[dict]):
    """text.format as the chat's response_format."""
    fmt = (text or {}).get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):  # said in the chat's shape ({"json_schema": ...}) by grammar.py
            raise bad("text.format of type json_schema needs its schema: {\"type\": \"json_schema\", \"name\": "
                      "..., \"schema\": {...}}", "text.format")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return fmt  # json_object, or what grammar.response_format names as wrong


def chat_request(req: ResponsesRequest, conversation: List[dict]) -> p.ChatRequest:
    """The chat request a Responses request asks for (a 400 for what cannot be served): the instructions, then the
    conversation (_messages)."""
    _refuse(req)
    fields = {k: getattr(req, k) for k in ("model", "temperature", "top_p", "seed", "stop", "chat_template_kwargs")
              + p.OWN_FIELDS}
    try:
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        return p.ChatRequest(messages=system + conversation, max_tokens=req.max_output_tokens,
                             tools=_tools(req) or None, parallel_tool_calls=req.parallel_tool_calls,
                             tool_choice=_tool_choice(req.tool_choice), response_format=_format(req.text), **fields)
    except ValidationError as e:  # what the checks above let through (they should not)
        raise bad(f"the input cannot be read as a conversation: {e.errors()[0].get('msg')}", "input") from None
