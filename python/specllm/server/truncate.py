"""A conversation longer than the context, fitted by leaving out its oldest messages: the Responses API's
`truncation: "auto"` (OpenAI: "the input is truncated by dropping items from the beginning of the conversation") and
what Ollama's /api/chat does with a long chat. The system messages and the last message are always kept, and the
kept part starts with a user message (never with a tool result whose call was left out), unless only the last
message fits."""
from __future__ import annotations

from typing import Callable, Optional

from . import protocol as p
from .errors import APIError


def _too_long(e: APIError) -> bool:
    return e.code == "context_length_exceeded"


def fit(state, req: p.ChatRequest, prepare: Callable, room: Optional[int] = None):
    """prepare(state, req) of the longest tail of req's messages (with all its system messages) that fits with room
    tokens left for the reply (room: req's max_tokens; None: 1, or a quarter of the context when req gives no
    max_tokens). The request whole when it fits; its context_length_exceeded 400 when not even its last message
    does."""
    try:
        return prepare(state, req)
    except APIError as e:
        if not _too_long(e):
            raise
        whole = e
    messages = req.messages
    keep = ("system", "developer")
    # a kept part starts at a user message (templates that want turns to alternate refuse an assistant's first)
    starts = [i for i in range(1, len(messages)) if messages[i].role == "user"]
    if messages[-1].role not in keep and len(messages) - 1 not in starts:
        starts.append(len(messages) - 1)  # the last message alone, whatever it is
    given = req.max_completion_tokens or req.max_tokens
    if given is None:  # the reply's room while fitting: then all that is left, as for any request
        room = room if room is not None else max(1, state.llm.n_ctx // 4)
    trial = req.model_copy(update={"max_tokens": room, "max_completion_tokens": None}) if given is None else req

    def tail(i: int) -> p.ChatRequest:
        return trial.model_copy(update={"messages": [m for j, m in enumerate(messages) if j >= i or m.role in keep]})

    lo, hi, found = 0, len(starts) - 1, None  # fewer messages, fewer tokens: the first start that fits
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            prepare(state, tail(starts[mid]))
            found, hi = starts[mid], mid - 1
        except APIError as e:
            if not _too_long(e):
                raise
            lo = mid + 1
    if found is None:
        raise whole
    return prepare(state, req.model_copy(update={"messages": tail(found).messages}))
