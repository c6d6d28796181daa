"""POST /v1/responses: OpenAI's Responses API, which agents call (the OpenAI Agents SDK, Codex CLI; llama-server,
LM Studio and Ollama serve it too). A request becomes the chat request it amounts to (responses_request.py) and runs
as /v1/chat/completions runs (prepare.prepare_chat), drafted and verified like any prompt. The answer is a Response:
a `message` item with the reply's text and a `function_call` item per tool call, plus specllm's `speculative`
object; streamed as the Responses events (response.created ... response.output_text.delta ... response.completed,
or response.incomplete when max_output_tokens cut the reply). POST /v1/responses/input_tokens counts a request's
prompt tokens.

A response is kept in memory (response_store.py: the last 256, unless `store: false`), so that the next request can
go on from it with `previous_response_id` (its conversation and reply come before the new input; the instructions
are the new request's), and GET / DELETE /v1/responses/{id} read or drop it; GET /v1/responses/{id}/input_items
lists its input items, and an `item_reference` input item names one of a kept response's items by its id."""
from __future__ import annotations

import itertools
import time
import uuid
from typing import List, NamedTuple, Optional

from fastapi import APIRouter, Request
from sse_starlette.sse import EventSourceResponse

from . import protocol as p
from . import jobs, prepare, truncate
from . import tools as tool_calls
from .errors import APIError, SafeJSONResponse, json_text
from .response_store import ResponseStore
from .responses_request import ResponsesRequest, bad, chat_request, conversation_of, listed, resolved

router = APIRouter()
# a chat request's parameter, as the Responses request names it (in the 400s prepare_chat raises)
PARAMS = {"messages": "input", "prompt": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


class Kept(NamedTuple):
    """What a response keeps of its request: its conversation (chat messages) and its input items."""
    conversation: List[dict]
    items: List[dict]


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


def _prepare(request: Request, req: ResponsesRequest, count_only: bool = False):
    """(state, start time, the chat request, its prompt and options, what the response will keep) of a request, or
    a 400 that names its field."""
    prior, prior_items = [], []
    if req.previous_response_id is not None:
        context = _store(request).context(req.previous_response_id)
        if context is None:
            raise APIError(404, f"the response '{req.previous_response_id}' is not kept here: specllm keeps the "
                                f"last {_store(request).max_responses} responses of requests without store: false, "
                                "until it stops; send the earlier items in input instead", "invalid_request_error",
                           "previous_response_id", "not_found")
        prior, prior_items = context
    if isinstance(req.input, list) and not req.input:
        raise bad("input must hold at least one item", "input")
    given = resolved(req.input, _store(request).item)
    if isinstance(given, list) and prior_items:  # an item the previous response already holds, sent again
        held = {item.get("id") for item in prior_items}
        for i, item in enumerate(given):
            if item.get("id") is not None and item.get("id") in held:
                raise bad(f"input[{i}] is the item {item['id']!r}, which the previous response already holds: "
                          "leave it out (previous_response_id brings it)", f"input.{i}", "duplicate_item")
    conversation = conversation_of(given, prior)
    chat = chat_request(req, conversation)
    state, t0 = jobs.begin(request, chat)
    kept = Kept(conversation, prior_items + listed(given))
    try:
        if req.truncation == "auto" and not count_only:  # the oldest items left out to fit
            return state, t0, chat, truncate.fit(state, chat, prepare.prepare_chat), kept
        return state, t0, chat, prepare.prepare_chat(state, chat, count_only), kept
    except APIError as e:  # named as the Responses request names it
        if e.param is not None:
            head = e.param.split(".", 1)[0]
            e.param = PARAMS.get(head, head) + e.param[len(head):]
        e.message = e.message.replace("max_tokens", "max_output_tokens").replace("response_format", "text.format")
        raise


class Answer:
    """A Response body, built as the reply comes in."""

    def __init__(self, state, req: ResponsesRequest, chat: p.ChatRequest):
        self.id, self.created = f"resp_{uuid.uuid4().hex}", int(time.time())
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.state, self.req = state, req
        self.tools = [{"type": "function", **t["function"]} for t in chat.tools or []]

    def body(self, status: str, output: list, last=None, job=None, error: Optional[APIError] = None) -> dict:
        req, stats = self.req, last.stats if last is not None else None
        usage = None if stats is None else {
            "input_tokens": stats.n_prompt, "input_tokens_details": {"cached_tokens": stats.n_cached, "cache_write_tokens": 0},
            "output_tokens": stats.n_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.n_prompt + stats.n_generated}
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": {"code": error.code or "server_error", "message": error.message} if error else None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "model": self.state.model_id, "output": output,
                "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
                "previous_response_id": req.previous_response_id, "store": req.store is not False,
                "temperature": req.temperature, "top_p": req.top_p,
                "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
                "tool_choice": req.tool_choice or "auto", "tools": self.tools,
                "truncation": req.truncation or "disabled", "metadata": req.metadata or {}, "usage": usage}
        if status in ("completed", "incomplete"):
            body["completed_at"] = int(time.time())
        if stats is not None and job is not None:
            body["speculative"] = jobs.speculative(stats, job, req.draft_length).model_dump()
        return body

    def message(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [self.part(text)]}

    @staticmethod
    def part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def keep(self, store: ResponseStore, kept: "Kept", content: str, calls: list, body: dict) -> None:
        """Keep a finished response (unless store: false): its conversation and its reply, its input items, and its
        body."""
        if self.req.store is False:
            return
        conversation = kept.conversation
        begun = prepare.prefill_of(conversation)
        if begun is not None:  # the reply went on from the input's last message: one turn, as the model saw it
            conversation, content = conversation[:-1], begun + content
        content = content.strip() if calls else content  # as parse() leaves the text around calls
        reply = {"role": "assistant", "content": content or None if calls else content}
        if calls:
            reply["tool_calls"] = calls
        store.put(self.id, conversation + [reply], body, kept.items)

    @staticmethod
    def call(call: dict, status: str = "completed") -> dict:
        return {"type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}


@router.post("/v1/responses/input_tokens")
async def input_tokens(request: Request, req: ResponsesRequest):
    """The prompt tokens a request would take (client.responses.input_tokens.count)."""
    prepared = (await jobs.prepared(request, _prepare, request, req, True))[3]  # however long: it is counted
    return {"object": "response.input_tokens", "input_tokens": len(prepared.tokens)}


@router.get("/v1/responses/{rid}")
async def get_response(request: Request, rid: str):
    body = _store(request).body(rid)
    if body is None:
        raise APIError(404, f"the response '{rid}' is not kept here (see previous_response_id)",
                       "invalid_request_error", "response_id", "not_found")
    return body


@router.get("/v1/responses/{rid}/input_items")
async def input_items(request: Request, rid: str):
    """The response's input items (client.responses.input_items.list): those of the responses it went on from and
    their output, then its own; newest first unless order=asc; `limit` (1-100, 20) of them after the item `after`."""
    items = _store(request).input_items(rid)
    if items is None:
        raise APIError(404, f"the response '{rid}' is not kept here", "invalid_request_error", "response_id",
                       "not_found")
    query = request.query_params
    order, after, limit = query.get("order", "desc"), query.get("after"), query.get("limit", "20")
    if order not in ("asc", "desc"):
        raise bad(f"order must be 'asc' or 'desc', got {order!r}", "order")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise bad(f"limit must be a whole number from 1 to 100, got {limit!r}", "limit")
    items = items[::-1] if order == "desc" else items
    if after is not None:
        at = [i for i, item in enumerate(items) if item.get("id") == after]
        if not at:
            raise bad(f"after names the item {after!r}, which is not among the response's input items", "after")
        items = items[at[0] + 1:]
    page = items[:int(limit)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)}


@router.delete("/v1/responses/{rid}")
async def delete_response(request: Request, rid: str):
    if not _store(request).delete(rid):
        raise APIError(404, f"the response '{rid}' is not kept here", "invalid_request_error", "response_id",
                       "not_found")
    return {"id": rid, "object": "response", "deleted": True}


@router.post("/v1/responses")
async def responses(request: Request, req: ResponsesRequest):
    state, t0, chat, prepared, kept = await jobs.prepared(request, _prepare, request, req)
    job = jobs.submit(request, prepared.tokens, prepared.opts)
    answer = Answer(state, req, chat)
    if req.stream:
        return EventSourceResponse(_events(request, job, answer, prepared, kept), ping=15, sep="\n")
    text, last, _ = await jobs.collect(request, job)
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
    content, calls = tool_calls.reply_parts(prepared.tools, prepared.forced, text)
    status = "incomplete" if last.finish_reason == "length" else "completed"
    output = [answer.message(content, status)] if content or not calls else []
    output += [answer.call(c) for c in calls]
    body = answer.body(status, output, last, job)
    answer.keep(_store(request), kept, content, calls, body)
    return SafeJSONResponse(body)


async def _events(request: Request, job, answer: Answer, prepared: prepare.Chat, kept: Kept):
    """The Responses events of a streamed reply; leaving early (the client went away) cancels the job."""
    state, t0 = answer.state, time.monotonic()
    numbers = itertools.count()

    def event(kind: str, **fields) -> dict:
        return {"event": kind, "data": json_text({"type": kind, "sequence_number": next(numbers), **fields})}

    held = tool_calls.reply_stream(prepared.tools, prepared.forced)
    texts: List[str] = []
    where = {"output_index": 0, "item_id": answer.message_id}
    try:
        yield event("response.created", response=answer.body("in_progress", []))
        yield event("response.in_progress", response=answer.body("in_progress", []))
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                err = jobs.generation_error(value)
                yield event("error", code=err.code, message=err.message, param=err.param)
                output = [answer.message("".join(texts), "incomplete")] if texts else []
                yield event("response.failed", response=answer.body("failed", output, error=err))
                break
            if kind == "end":
                break
            text, calls = held.pass_on(value.text, value.finish_reason is not None) if held else (value.text, [])
            if text and (texts or not calls or text.strip()):
                if not texts:
                    state.metrics.ttft_seconds.observe(time.monotonic() - t0)
                    yield event("response.output_item.added", output_index=0,
                                item=dict(answer.message("", "in_progress"), content=[]))
                    yield event("response.content_part.added", **where, content_index=0, part=answer.part(""))
                texts.append(text)
                yield event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])
            if value.finish_reason is None:
                continue
            status = "incomplete" if value.finish_reason == "length" else "completed"
            output = []
            if texts or not calls:
                whole = "".join(texts)
                if not texts:  # an empty reply: its message, as the whole-body answer has it
                    yield event("response.output_item.added", output_index=0,
                                item=dict(answer.message("", "in_progress"), content=[]))
                    yield event("response.content_part.added", **where, content_index=0, part=answer.part(""))
                yield event("response.output_text.done", **where, content_index=0, text=whole, logprobs=[])
                yield event("response.content_part.done", **where, content_index=0, part=answer.part(whole))
                output.append(answer.message(whole, status))
                yield event("response.output_item.done", output_index=0, item=output[-1])
            for call in calls:
                item, index = answer.call(call), len(output)
                yield event("response.output_item.added", output_index=index,
                            item=dict(item, arguments="", status="in_progress"))
                yield event("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                            delta=item["arguments"])
                yield event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                            name=item["name"], arguments=item["arguments"])
                yield event("response.output_item.done", output_index=index, item=item)
                output.append(item)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            body = answer.body(status, output, value, job)
            answer.keep(_store(request), kept, "".join(texts), calls, body)
            yield event(kind, response=body)
    finally:
        job.cancel()
        state.metrics.request_seconds.labels(endpoint=request.url.path).observe(time.monotonic() - t0)
