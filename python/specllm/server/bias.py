"""logit_bias as the servers take it: OpenAI's {"token id": bias} and llama-server's forms, {"token id or text":
bias} and [[token id or text, bias or false], ...]. A text biases each of its tokens (as llama-server tokenizes it);
false bans the token (-inf). Biases are added to the logits after the repetition penalties, target and draft model
alike (specllm.LLM's logit_bias)."""
from __future__ import annotations

import math
import numbers
from typing import Optional

from .errors import APIError


def _bad(message: str) -> APIError:
    return APIError(400, f"logit_bias: {message}", "invalid_request_error", "logit_bias", "invalid_value")


def _bias(key, value) -> float:
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise _bad(f"the bias of {key!r} must be a finite number (OpenAI's range is -100..100) or false to ban the "
                   f"token, got {value!r}")
    return float(value)


def _tokens(llm, key) -> list:
    if isinstance(key, str):
        try:
            return [int(key, 10)] if key.strip().lstrip("-").isdigit() else llm.tokenize(key, False)
        except (TypeError, ValueError) as e:
            raise _bad(f"{key!r}: {e}") from None
    if isinstance(key, bool) or not isinstance(key, int):
        raise _bad(f"each entry names a token id or a text, got {key!r}")
    return [key]


def parse(llm, value) -> Optional[dict]:
    """{token id: bias} of a request's logit_bias (None when it sets none); a 400 for a malformed one or a token
    id outside the model's vocabulary."""
    if value is None or value == {} or value == []:
        return None
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(e, list) and len(e) == 2 for e in value):
        pairs = [tuple(e) for e in value]
    else:
        raise _bad('give {"token id": bias, ...} or [[token id or text, bias or false], ...]')
    n_vocab = llm._engine.target.n_vocab
    out = {}
    for key, value in pairs:
        bias = _bias(key, value)
        for token in _tokens(llm, key):
            if not 0 <= token < n_vocab:
                raise _bad(f"token id {token} is not in the model's vocabulary (0..{n_vocab - 1})")
            out[token] = bias
    return out
