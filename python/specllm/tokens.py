"""LLM's text helpers (tokens.TokenMethods): text to token ids and back, and the tokens a prompt evaluates (a text
with BOS once, checked token ids, or a fill-in-the-middle prompt)."""
from __future__ import annotations

import numbers
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from . import infill
from .errors import InvalidOptionError
from .options import _int, flag
from .options import text as _text

Prompt = Union[str, Sequence[int]]


class TokenMethods:
    """LLM's methods between text and the target's token ids."""

    @property
    def n_ctx(self) -> int:
        return self._engine.target.n_ctx

    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        return self._engine.target.tokenize(_text("text", text), flag("add_special", add_special), True)

    def count_tokens(self, prompt: Prompt) -> int:
        """The number of tokens generate(prompt) would evaluate (BOS included)."""
        return len(self._prompt_tokens(prompt))

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """The tokens' text; control tokens (BOS, <|im_end|>, ...) left out unless special (then their text, as
        llama-server's /detokenize renders them)."""
        return self._engine.target.detokenize(self._token_ids(tokens, "tokens"), flag("special", special))

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token's text (a piece of a UTF-8 character for some); b"" for control tokens unless
        special."""
        return self._engine.target.piece(self._token_ids([token], "token")[0], flag("special", special))

    def prompt_tokens(self, prompt: Prompt) -> List[int]:
        """The tokens generate(prompt) evaluates: text tokenized with BOS (once), or checked token ids."""
        return self._prompt_tokens(prompt)

    def infill_prompt(self, prefix: str, suffix: str, max_tokens: int = 256, *,
                      extra: Optional[Sequence[Tuple[str, str]]] = None, middle: str = "") -> List[int]:
        """The tokens generate(prefix, suffix=suffix) evaluates: the model's fill-in-the-middle form (infill.py),
        what does not fit beside max_tokens cut from the start of the prefix and the end of the suffix. extra:
        (filename, text) chunks of other files before it, in the repo-level form (the server's /infill); middle:
        text the middle starts with. InvalidOptionError for a model without FIM tokens."""
        prefix, suffix, middle = _text("prompt", prefix), _text("suffix", suffix), _text("middle", middle)
        _int("max_tokens", max_tokens, lo=0)
        if extra is not None:
            extra = [_chunk(i, c) for i, c in enumerate(_listed("extra", extra))]
        return infill.prompt(self._engine.target, prefix, suffix, self.n_ctx - max_tokens, extra, middle)

    def _prompt_tokens(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            bos = self._engine.target.tokenize("", True, False)  # [bos] when the model adds one
            tokens = self._engine.target.tokenize(_text("prompt", prompt), True, True)
            if len(bos) == 1 and len(tokens) >= 2 and tokens[0] == tokens[1] == bos[0]:
                tokens = tokens[1:]  # the text (a chat template) already starts with BOS
            return tokens
        return self._token_ids(prompt, "prompt")

    def _token_ids(self, tokens, name: str) -> List[int]:
        kind = "a str or a list of token ids" if name == "prompt" else "a list of token ids"
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise TypeError(f"{name} must be {kind}, got {type(tokens).__name__}")
        tokens = list(tokens)
        bad_type = next((t for t in tokens if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
        if bad_type is not None:
            raise TypeError(f"{name} must be {kind}, it holds {type(bad_type).__name__} {bad_type!r}")
        n_vocab = self._engine.target.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise InvalidOptionError(f"token ids must be in [0, {n_vocab}), got {bad[0]}")
        return [int(t) for t in tokens]


def _listed(name: str, value) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of (filename, text) pairs, got {type(value).__name__}")
    return list(value)


def _chunk(i: int, chunk) -> Tuple[str, str]:
    if isinstance(chunk, (str, bytes)) or not isinstance(chunk, Sequence) or len(chunk) != 2:
        raise TypeError(f"extra[{i}] must be a (filename, text) pair, got {chunk!r:.80}")
    return _text(f"extra[{i}] filename", chunk[0]), _text(f"extra[{i}] text", chunk[1])
