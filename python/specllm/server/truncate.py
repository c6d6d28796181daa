"""A conversation longer than the context, fitted by leaving out its oldest messages: the Responses API's
`truncation: "auto"` (OpenAI: "the input is truncated by dropping items from the beginning of the conversation") and
what Ollama's /api/chat does with a long chat (ollama_context.py). The system messages and the last message are
always kept, and the kept part starts with a user message (never with a tool result whose call was left out, nor
with an assistant's turn, which templates that want turns to alternate refuse), unless only the last message fits."""
from __future__ import annotations

from typing import Callable, Optional

from . import protocol as p
from .errors import APIError

OVERFLOW = "context_length_exceeded"  # the code of prepare's 400 for a prompt longer than the context


def _role(message) -> Optional[str]:
    return message.get("role") if isinstance(message, dict) else message.role


def kept(messages: list, start: int) -> list:
    """The system messages before start, then the messages from start on."""
    return [m for m in messages[:start] if _role(m) in ("system", "developer")] + list(messages[start:])


def longest_tail(messages: list, attempt: Callable, n_ctx: int, room: int) -> tuple:
    """(start, chat): attempt(kept(messages, start)) -> the prepared chat (prepare.Chat; an OVERFLOW APIError when its
    prompt alone is too long) of the longest tail of messages that leaves room tokens of the context for the reply;
    the whole conversation when it does. When even the last message leaves less room: that one (with the system
    messages, and the user message it answers if it is the assistant's), if its prompt fits at all; else the OVERFLOW
    error."""
    tried = {}

    def chat(start: int):
        if start not in tried:
            try:
                tried[start] = attempt(kept(messages, start))
            except APIError as e:
                if e.code != OVERFLOW:
                    raise
                tried[start] = e
        return tried[start]

    def fits(start: int) -> bool:
        c = chat(start)
        return not isinstance(c, APIError) and len(c.tokens) + room <= n_ctx

    last = len(messages) - 1
    if fits(0):
        return 0, chat(0)
    # the last message alone when nothing else fits, unless it is the assistant's (a reply begun): that one is kept
    # with the user message it answers, or it would be a conversation of its own (prepare.prefill_of)
    starts = [i for i in range(1, last) if _role(messages[i]) == "user"]
    starts += [] if _role(messages[last]) == "assistant" and starts else [last]
    lo, hi = 0, len(starts) - 1  # fewer messages, fewer tokens: the first start that fits
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(starts[mid]):
            hi = mid
        else:
            lo = mid + 1
    found = chat(starts[lo])  # the last message alone when nothing fits with room: what room there is
    if isinstance(found, APIError):
        raise found
    return starts[lo], found


def fit(state, req: p.ChatRequest, prepare: Callable):
    """prepare(state, req) of the longest tail of req's messages that fits the context with its max_tokens (a quarter
    of the context when it gives none, then all that is left, as for any request): Responses' truncation "auto".
    Each tail is prepared as the request is, max_tokens and all: its own check is the fit for a given max_tokens."""
    given = req.max_completion_tokens or req.max_tokens
    n_ctx = state.llm.n_ctx
    _, chat = longest_tail(req.messages, lambda messages: prepare(state, req.model_copy(update={
        "messages": messages})), n_ctx, given or max(1, n_ctx // 4))
    return chat
