"""Logprobs in the OpenAI API's two shapes: chat's `choices[].logprobs.content` (a list of token entries with
their bytes and top_logprobs) and completions' `choices[].logprobs` (parallel lists: tokens, token_logprobs,
top_logprobs as {token: logprob}, text_offset). A token's text is its bytes decoded with replacement (a token
may hold part of a UTF-8 character); its bytes are exact. Entries go out with the text they belong to: a stop
string's tokens, whose text is cut, are left out, as OpenAI's API and llama-server do."""
from __future__ import annotations

from typing import Callable, List, Optional

from .. import _core
from ..results import TokenLogprob
from . import protocol as p
from .errors import APIError


def _count(value, param: str) -> int:
    if not 0 <= value <= _core.max_top_logprobs:
        raise APIError(400, f"{param} must be between 0 and {_core.max_top_logprobs}, got {value}",
                       "invalid_request_error", param, "invalid_value")
    return value


def chat_request(req: p.ChatRequest) -> Optional[int]:
    """How many top logprobs a chat request asks for, None for no logprobs; a 400 for a contradiction."""
    if req.logprobs is not None and not isinstance(req.logprobs, bool):
        if req.logprobs not in (0, 1):  # 0 and 1 as false and true: some clients send them
            raise APIError(400, "logprobs must be true or false in a chat request (top_logprobs says how many "
                                "alternatives)", "invalid_request_error", "logprobs", "invalid_value")
        req.logprobs = bool(req.logprobs)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "invalid_request_error", "top_logprobs",
                       "invalid_value")
    return _count(req.top_logprobs or 0, "top_logprobs") if req.logprobs else None


def completion_request(req: p.CompletionRequest) -> Optional[int]:
    """How many top logprobs a completions request asks for (its logprobs is that number), None for none."""
    if isinstance(req.logprobs, bool):
        raise APIError(400, "logprobs of a completions request is the number of most likely tokens to list "
                            "(0..20), not a boolean", "invalid_request_error", "logprobs", "invalid_value")
    if req.top_logprobs is not None:
        raise APIError(400, "top_logprobs belongs to chat requests; here logprobs is the number of most likely "
                            "tokens to list", "invalid_request_error", "top_logprobs", "unsupported_parameter")
    return None if req.logprobs is None else _count(req.logprobs, "logprobs")


class Released:
    """Hands out logprob entries as far as the reply's text has gone: an entry once the text reaches its first byte."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self.token_bytes = token_bytes
        self.pending: List[TokenLogprob] = []
        self.text_bytes = 0   # of the text released so far
        self.token_start = 0  # where the next pending entry's bytes start

    def add(self, entries: Optional[List[TokenLogprob]], text: Optional[str]) -> List[TokenLogprob]:
        if entries is None:  # not asked for (a chunk asked for carries a list, perhaps empty): nothing to count
            return []
        self.pending.extend(entries)
        self.text_bytes += len((text or "").encode("utf-8"))
        out = []
        while self.pending and self.token_start < self.text_bytes:
            e = self.pending.pop(0)
            out.append(e)
            self.token_start += len(self.token_bytes(e.token))
        return out


def _entry(token_bytes: Callable[[int], bytes], token: int, logprob: float) -> dict:
    b = token_bytes(token)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}


def chat(entries: List[TokenLogprob], token_bytes: Callable[[int], bytes]) -> dict:
    content = []
    for e in entries:
        item = _entry(token_bytes, e.token, e.logprob)
        item["top_logprobs"] = [_entry(token_bytes, t, lp) for t, lp in e.top]
        content.append(item)
    return {"content": content, "refusal": None}


def completion(entries: List[TokenLogprob], token_bytes: Callable[[int], bytes], text_offset: int = 0) -> dict:
    tokens, offsets, tops = [], [], []
    for e in entries:
        text = token_bytes(e.token).decode("utf-8", errors="replace")
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        top = {}
        for t, lp in e.top:  # two tokens with one text (rare) keep the likelier
            top.setdefault(token_bytes(t).decode("utf-8", errors="replace"), lp)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def echoed(tokens: List[int], entries: List[Optional[TokenLogprob]], token_bytes: Callable[[int], bytes],
           text: str) -> dict:
    """completions' logprobs of an echoed prompt (echo with logprobs, as eval harnesses score a text): one entry per
    prompt token, the first's logprob and top_logprobs null (nothing before it to score it by). text: the prompt as
    echoed. A tokenizer that adds a space before the first word (SentencePiece) gives tokens whose texts are longer
    than it: their offsets are counted back from the end, so that each token ends where it ends in the text."""
    body = completion(entries[1:], token_bytes)
    first = token_bytes(tokens[0]).decode("utf-8", errors="replace")
    extra = max(0, len(first) + sum(len(t) for t in body["tokens"]) - len(text))
    offsets = [0] + [max(0, len(first) + o - extra) for o in body["text_offset"]]
    return {"tokens": [first] + body["tokens"], "token_logprobs": [None] + body["token_logprobs"],
            "top_logprobs": [None] + body["top_logprobs"], "text_offset": offsets}


def joined(head: dict, tail: dict) -> dict:
    """Two completions' logprobs bodies one after the other (the echoed prompt's, then the reply's)."""
    return {k: head[k] + tail[k] for k in head}
