"""POST /v1/messages: Anthropic's Messages API, which Anthropic-SDK apps and agents call (llama-server, LM Studio
and Ollama serve it too; point ANTHROPIC_BASE_URL at the server). A request becomes a chat request — `system` the
system message, text blocks the messages' text, an assistant's `tool_use` blocks its tool calls, a user's
`tool_result` blocks tool messages, `tools` (name, description, input_schema) the chat's tools, `tool_choice`
auto / any / tool / none, `stop_sequences` stop, `output_config.format` a JSON schema — and runs as
/v1/chat/completions runs (prepare.prepare_chat). The answer is a Message (text and tool_use blocks, stop_reason
end_turn / max_tokens / stop_sequence / tool_use, usage with cache_read_input_tokens) plus specllm's
`speculative` object; streamed as Anthropic's events (message_start, content_block_start / _delta / _stop,
message_delta, message_stop). Errors have Anthropic's shape here ({"type": "error", "error": {...}}), and the API
key may come as `x-api-key`. POST /v1/messages/count_tokens gives a request's prompt tokens.

Not served: images and documents (a 400), server tools (bash, web_search...: not offered to the model, as hosted
tools on /v1/responses), extended thinking (the `thinking` field is accepted; the model does not think aloud)."""
from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, Dict, List, Optional, Union

from fastapi import APIRouter, Request
from pydantic import Field, ValidationError
from sse_starlette.sse import EventSourceResponse

from . import protocol as p
from . import jobs, prepare
from . import tools as tool_calls
from .errors import APIError, SafeJSONResponse, json_text

router = APIRouter()
log = logging.getLogger("specllm.server")
PARAMS = {"stop": "stop_sequences", "response_format": "output_config.format", "tool_choice": "tool_choice"}
CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class MessagesRequest(p.OwnFields):  # specllm's own fields, as on /v1/chat/completions
    model: Optional[str] = None
    messages: List[Dict[str, Any]]
    max_tokens: Optional[int] = Field(None, ge=1)
    system: Union[str, List[Dict[str, Any]], None] = None
    stop_sequences: Optional[List[str]] = None
    temperature: Optional[float] = Field(None, ge=0, le=1)  # Anthropic's range
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stream: bool = False
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Dict[str, Any]] = None
    output_config: Optional[Dict[str, Any]] = None
    metadata: Optional[Dict[str, Any]] = None
    thinking: Optional[Dict[str, Any]] = None
    container: Optional[Any] = None
    mcp_servers: Optional[List[Any]] = None
    seed: Optional[int] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None  # llama-server's, as on /v1/chat/completions


def _bad(message: str, param: Optional[str], code: str = "invalid_value") -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def _text(blocks, where: str) -> str:
    """The text of a system prompt or a tool result: a string, or text blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise _bad(f"only text is supported: {where}[{j}] must be a text block ({{'type': 'text', 'text': ...}}), "
                       f"got {kind!r}", f"{where}.{j}", "unsupported_content")
        texts.append(b["text"])
    return "".join(texts)


def _message(m: dict, i: int) -> List[dict]:
    """The chat messages of one Anthropic message: a user's tool results come first, as tool messages."""
    role, content, where = m.get("role"), m.get("content"), f"messages.{i}"
    if role not in ("user", "assistant"):
        raise _bad(f"messages[{i}].role must be 'user' or 'assistant', got {role!r} (the system prompt goes in "
                   "system)", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad(f"messages[{i}].content must be a string or a list of content blocks", f"{where}.content")
    texts, calls, results = [], [], []
    for j, b in enumerate(content):
        kind, at = b.get("type") if isinstance(b, dict) else None, f"{where}.content.{j}"
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise _bad(f"messages[{i}].content[{j}] (a tool_use block) needs id and name as strings", at)
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise _bad(f"messages[{i}].content[{j}].input must be an object", f"{at}.input")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json_text(args)}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise _bad(f"messages[{i}].content[{j}] (a tool_result block) needs tool_use_id", f"{at}.tool_use_id")
            text = _text(b.get("content", ""), f"{at}.content")
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": f"Error: {text}" if b.get("is_error") else text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # a thinking model's thoughts sent back: not part of the prompt
        elif kind in ("image", "document"):
            raise _bad(f"only text is supported: messages[{i}].content[{j}] is an {kind} block", f"{at}.type",
                       "unsupported_content")
        else:
            raise _bad(f"messages[{i}].content[{j}]: a {role} message cannot hold a block of type {kind!r} here "
                       "(text; tool_use in an assistant's, tool_result in a user's)", f"{at}.type",
                       "unsupported_content")
    out = results
    if texts or calls or not results:
        msg = {"role": role, "content": prepare.joined_parts(texts) if texts or not calls else None}
        if calls:
            msg["tool_calls"] = calls
        out = out + [msg]
    return out


def _tools(req: MessagesRequest) -> List[dict]:
    out = []
    for i, t in enumerate(req.tools or []):
        if t.get("type") not in (None, "custom"):  # a server tool (bash_..., web_search_...): Anthropic runs those
            log.warning("/v1/messages: tools[%d] of type %r is not offered to the model (client tools only)", i,
                        t.get("type"))
            continue
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{i}] needs a name ({{'name': ..., 'description': ..., 'input_schema': {{...}}}})",
                       f"tools.{i}.name")
        fn = {"name": t["name"]}  # in OpenAI's order (templates write the tools out as they come)
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("input_schema") or {"type": "object"}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Optional[dict]):
    if choice is None:
        return None
    kind = choice.get("type")
    if isinstance(kind, str) and kind in CHOICES:
        return CHOICES[kind]
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(f"tool_choice must be {{'type': 'auto'}}, {{'type': 'any'}}, {{'type': 'none'}} or {{'type': 'tool', "
               f"'name': ...}}, got {choice!r:.80}", "tool_choice")


def _format(config: Optional[dict]):
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    raise _bad("output_config.format must be {'type': 'json_schema', 'schema': {...}}", "output_config.format")


def chat_request(req: MessagesRequest) -> p.ChatRequest:
    """The chat request an Anthropic request asks for (a 400 for what cannot be served)."""
    for param, given in (("container", req.container), ("mcp_servers", req.mcp_servers)):
        if given:
            raise _bad(f"{param} is not supported: specllm runs no server tools", param, "unsupported_parameter")
    if not req.messages:
        raise _bad("messages must hold at least one message", "messages")
    messages = [{"role": "system", "content": _text(req.system, "system")}] if req.system else []
    for i, m in enumerate(req.messages):
        messages += _message(m, i)
    fields = {k: getattr(req, k) for k in ("model", "max_tokens", "temperature", "top_p", "seed",
                                           "chat_template_kwargs") + p.OWN_FIELDS}
    try:
        return p.ChatRequest(messages=messages, stop=req.stop_sequences, tools=_tools(req) or None,
                             tool_choice=_tool_choice(req.tool_choice), response_format=_format(req.output_config),
                             parallel_tool_calls=False if (req.tool_choice or {}).get("disable_parallel_tool_use")
                             is True else None, **fields)
    except ValidationError as e:  # what the checks above let through (they should not)
        raise _bad(f"the messages cannot be read as a conversation: {e.errors()[0].get('msg')}", "messages") from None


def _prepare(request: Request, req: MessagesRequest, count_only: bool = False):
    chat = chat_request(req)
    state, t0 = jobs.begin(request, chat)
    try:
        return state, t0, chat, prepare.prepare_chat(state, chat, count_only)
    except APIError as e:  # named as the Anthropic request names it
        if e.param is not None:
            head = e.param.split(".", 1)[0]
            e.param = PARAMS.get(head, head) + e.param[len(head):]
        e.message = e.message.replace("response_format", "output_config.format")
        raise


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, req: MessagesRequest):
    _, _, _, prepared = await jobs.prepared(request, _prepare, request, req, True)  # however long: it is counted
    return {"input_tokens": len(prepared.tokens)}


def _stop(state, reason: str, calls, tokens: List[int], stops) -> tuple:
    """(stop_reason, stop_sequence) of a finished reply."""
    if calls and reason == "stop":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if stops and tokens and not state.llm._engine.target.is_eog(tokens[-1]):
        whole = state.llm.detokenize(tokens)  # the stop string the reply was cut at: the first one in it
        found = [(whole.find(s), s) for s in stops if s and whole.find(s) >= 0]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


def _usage(stats) -> dict:
    return {"input_tokens": stats.n_prompt - stats.n_cached, "cache_read_input_tokens": stats.n_cached,
            "cache_creation_input_tokens": 0, "output_tokens": stats.n_generated}


def _tool_use(call: dict) -> dict:
    return {"type": "tool_use", "id": f"toolu_{call['id'].removeprefix('call_')}", "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def _blocks(text: str, calls: list) -> List[dict]:
    return ([{"type": "text", "text": text}] if text or not calls else []) + [_tool_use(c) for c in calls]


@router.post("/v1/messages")
async def messages(request: Request, req: MessagesRequest):
    state, t0, chat, prepared = await jobs.prepared(request, _prepare, request, req)
    job = jobs.submit(request, prepared.tokens, prepared.opts)
    mid = f"msg_{uuid.uuid4().hex}"
    head = {"id": mid, "type": "message", "role": "assistant", "model": state.model_id}
    if req.stream:
        return EventSourceResponse(_events(request, job, head, prepared, req), ping=15, sep="\n")
    tokens = []
    said, last, _ = await jobs.collect(request, job, tokens)
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
    content, calls = tool_calls.reply_parts(prepared.tools, prepared.forced, said)
    reason, sequence = _stop(state, last.finish_reason, calls, tokens, req.stop_sequences)
    return SafeJSONResponse(dict(head, content=_blocks(content, calls), stop_reason=reason, stop_sequence=sequence,
                             usage=_usage(last.stats),
                             speculative=jobs.speculative(last.stats, job, req.draft_length).model_dump()))


async def _events(request: Request, job, head: dict, prepared: prepare.Chat, req: MessagesRequest):
    """Anthropic's events of a streamed reply; leaving early (the client went away) cancels the job."""
    state, t0 = request.app.state.specllm, time.monotonic()

    def event(kind: str, **fields) -> dict:
        return {"event": kind, "data": json_text({"type": kind, **fields})}

    held = tool_calls.reply_stream(prepared.tools, prepared.forced)
    texts, tokens, index = [], [], 0  # index: the next content block's
    try:
        yield event("message_start", message=dict(head, content=[], stop_reason=None, stop_sequence=None, usage={
            "input_tokens": len(prepared.tokens), "output_tokens": 0}))
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                err = jobs.generation_error(value)
                yield event("error", error=err.anthropic_body()["error"])
                break
            if kind == "end":
                break
            tokens.extend(value.tokens)
            text, calls = held.pass_on(value.text, value.finish_reason is not None) if held else (value.text, [])
            if text and (texts or not calls or text.strip()):
                if not texts:
                    state.metrics.ttft_seconds.observe(time.monotonic() - t0)
                    yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                texts.append(text)
                yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
            if value.finish_reason is None:
                continue
            if texts or not calls:
                if not texts:
                    yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                yield event("content_block_stop", index=0)
                index = 1
            for block in map(_tool_use, calls):
                yield event("content_block_start", index=index, content_block=dict(block, input={}))
                yield event("content_block_delta", index=index, delta={
                    "type": "input_json_delta", "partial_json": json_text(block["input"])})
                yield event("content_block_stop", index=index)
                index += 1
            reason, sequence = _stop(state, value.finish_reason, calls, tokens, req.stop_sequences)
            yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                        usage=_usage(value.stats),
                        speculative=jobs.speculative(value.stats, job, req.draft_length).model_dump())
            yield event("message_stop")
    finally:
        job.cancel()
        state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
