"""Logprobs in the OpenAI API's two shapes: chat's `choices[].logprobs.content` (a list of token entries with
their bytes and top_logprobs) and completions' `choices[].logprobs` (parallel lists: tokens, token_logprobs,
top_logprobs as {token: logprob}, text_offset). A token's text is its bytes decoded with replacement (a token
may hold part of a UTF-8 character); its bytes are exact. Entries go out with the text they belong to: a stop
string's tokens, whose text is cut, are left out, as OpenAI's API and llama-server do."""
from __future__ import annotations

import codecs
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
    """Hands out logprob entries as far as the reply's text has gone: an entry once the text reaches its first
    character. Counted in characters, the tokens' bytes decoded as the text was (with replacement): counted in
    bytes, an invalid byte in the text (U+FFFD, three bytes) ran ahead of the tokens and let a stop string's own
    entry out."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self.token_bytes = token_bytes
        self.pending: List[TokenLogprob] = []
        self.text_chars = 0  # of the text released so far
        self.starts = Offsets()  # .at: the character the next pending entry's bytes start in

    def add(self, entries: Optional[List[TokenLogprob]], text: Optional[str]) -> List[TokenLogprob]:
        if entries is None:  # not asked for (a chunk asked for carries a list, perhaps empty): nothing to count
            return []
        self.pending.extend(entries)
        self.text_chars += len(text or "")
        out = []
        while self.pending and self.starts.at < self.text_chars:
            e = self.pending.pop(0)
            out.append(e)
            self.starts.of([self.token_bytes(e.token)])
        return out


class Offsets:
    """Where tokens' texts begin in the text they make, in characters, token after token (a stream's chunks share
    one): their bytes decoded one after another with replacement, a character split between tokens counted once,
    where it begins (each token counted as its own U+FFFD put every later token a character further per split)."""

    def __init__(self, start: int = 0):
        self.at = start
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def of(self, pieces: List[bytes]) -> List[int]:
        out = []
        for b in pieces:
            out.append(self.at)
            self.at += len(self.decoder.decode(b))
        return out

    def end(self) -> int:
        return self.at + len(self.decoder.decode(b"", final=True))


def _key(b: bytes) -> str:
    """A top_logprobs key: the token's text, or "bytes:\\xNN..." for part of a character, as OpenAI writes it (each
    such token folded into one U+FFFD key, and a position listed fewer alternatives than asked for)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


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


def completion(entries: List[TokenLogprob], token_bytes: Callable[[int], bytes], text_offset=0) -> dict:
    """text_offset: where the first entry's text begins (an int), or the Offsets of a stream's earlier chunks."""
    offsets = text_offset if isinstance(text_offset, Offsets) else Offsets(text_offset)
    pieces = [token_bytes(e.token) for e in entries]
    tops = []
    for e in entries:
        top = {}
        for t, lp in e.top:  # two tokens with one text (rare) keep the likelier
            top.setdefault(_key(token_bytes(t)), lp)
        tops.append(top)
    return {"tokens": [b.decode("utf-8", errors="replace") for b in pieces],
            "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets.of(pieces)}


def echoed(tokens: List[int], entries: List[Optional[TokenLogprob]], token_bytes: Callable[[int], bytes],
           text: str) -> dict:
    """completions' logprobs of an echoed prompt (echo with logprobs, as eval harnesses score a text): one entry per
    prompt token, the first's logprob and top_logprobs null (nothing before it to score it by). text: the prompt as
    echoed. A tokenizer that adds a space before the first word (SentencePiece) gives tokens whose texts are longer
    than it: their offsets are counted back from the end, so that each token ends where it ends in the text."""
    body = completion(entries[1:], token_bytes)
    counter = Offsets()
    offsets = counter.of([token_bytes(tokens[0])] + [token_bytes(e.token) for e in entries[1:]])
    extra = max(0, counter.end() - len(text))
    return {"tokens": [token_bytes(tokens[0]).decode("utf-8", errors="replace")] + body["tokens"],
            "token_logprobs": [None] + body["token_logprobs"], "top_logprobs": [None] + body["top_logprobs"],
            "text_offset": [0] + [max(0, o - extra) for o in offsets[1:]]}


def joined(head: dict, tail: dict) -> dict:
    """Two completions' logprobs bodies one after the other (the echoed prompt's, then the reply's)."""
    return {k: head[k] + tail[k] for k in head}
