"""Fitting an Ollama request in the model's context as Ollama does, where the OpenAI endpoints answer a 400: a
conversation longer than the context loses its oldest messages (server/prompt.go chatPrompt keeps the system
messages and always the latest message), and num_predict is capped at what the context has left (the reply then
ends with done_reason "length"). Ollama can shift its context to go on past the end; specllm cannot, so a
conversation is cut so as to leave room for the reply: num_predict tokens, at most a quarter of the context (a
quarter when num_predict is not given)."""
from __future__ import annotations

from typing import Callable, List, Optional

from . import prepare, truncate
from .errors import APIError
from .ollama_request import bad


def too_long(n_ctx: int, what: str) -> APIError:
    """Ollama's error for an input that leaves no room in the context (with what it was)."""
    return bad(f"the input length exceeds the context length: {what} needs more than the model's context of {n_ctx} "
               "tokens; shorten it", "messages" if "message" in what else "prompt")


def capped(n_ctx: int, n_prompt: int, max_tokens: Optional[int]) -> int:
    """num_predict (None: until the end) at most what the context has left after the prompt."""
    if n_prompt >= n_ctx:
        raise too_long(n_ctx, "the prompt")
    return min(max_tokens or n_ctx, n_ctx - n_prompt)


def fit_chat(state, messages: List[dict], build: Callable[[List[dict]], object],
             max_tokens: Optional[int], cut: bool = True) -> prepare.Chat:
    """prepare.prepare_chat of the longest tail of the conversation that fits with room for the reply (all of it when
    it fits: truncate.longest_tail), its max_tokens capped; build(messages) is the chat request of those messages
    (without max_tokens). The latest message is kept whatever its length, and a 400 when even that leaves no room.
    cut False (Ollama's truncate: false): the whole conversation, or the 400."""
    n_ctx = state.llm.n_ctx
    room = min(max_tokens, n_ctx // 4) if max_tokens else n_ctx // 4
    try:
        if not cut:
            chat = prepare.prepare_chat(state, build(messages))
        else:
            _, chat = truncate.longest_tail(messages, lambda kept: prepare.prepare_chat(state, build(kept)), n_ctx,
                                            room)
    except APIError as e:
        if e.code != truncate.OVERFLOW:
            raise
        raise too_long(n_ctx, "the latest message (with the system messages)" if cut else "the messages") from None
    chat.opts["max_tokens"] = capped(n_ctx, len(chat.tokens), max_tokens)
    return chat
