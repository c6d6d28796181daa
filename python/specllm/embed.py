"""Embeddings (LLM.embed): the inputs checked and tokenized, and one vector each from the C++ Embedder (embed.h),
a context of its own over the target's weights (mean of the last layer's hidden states) or over an embedding
model's GGUF (its own pooling)."""
from __future__ import annotations

import numbers
import os
import threading
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, gguf_check, logs
from .errors import Cancelled, ContextOverflowError, InvalidOptionError, ModelLoadError
from .options import flag
from .options import path as _path
from .options import text as _text
from .gate import Call

Input = Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]]


def _is_ids(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) and len(value) > 0 and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value)


def split(value: Input) -> Tuple[list, bool]:
    """(the inputs, each a text or a token id list; whether value was one input): a text, a token id list, or a
    list of either (OpenAI's four forms of `input`)."""
    if isinstance(value, str):
        return [value], True
    if _is_ids(value):
        return [value], True
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"input must be a str, a list of token ids, or a list of those, got {type(value).__name__}")
    if not value:
        raise InvalidOptionError("input is an empty list: pass a text, a list of texts, or token ids")
    for i, item in enumerate(value):
        if not isinstance(item, str) and not _is_ids(item):
            raise TypeError(f"input[{i}] must be a str or a non-empty list of token ids, got "
                            f"{type(item).__name__ if not isinstance(item, (list, tuple)) else 'an empty list'}")
    return list(value), False


def tokens(embedder, items: list, truncate: bool) -> List[List[int]]:
    """Each input's tokens (texts with the model's special tokens: BOS, CLS/SEP, EOS as it adds them), cut to the
    embedding context when truncate (the special tokens the model adds at the end kept: a CLS/SEP or last-token
    pooling reads them); an input that is empty, too long (and not truncate) or holds an id outside the vocabulary
    raises InvalidOptionError / ContextOverflowError naming it. items: split()'s."""
    out = []
    for i, item in enumerate(items):
        name = "input" if len(items) == 1 else f"input[{i}]"
        if isinstance(item, str) and not _text(name, item):
            raise InvalidOptionError(f"{name} is empty: an embedding needs some text")
        ids = embedder.tokenize(item) if isinstance(item, str) else [int(t) for t in item]
        huge = next((t for t in ids if not -2**31 <= t < 2**31), None)  # the engine's check reads 32-bit ids
        if huge is not None:
            raise InvalidOptionError(f"{name}: token {huge} is not in the embedding model's vocabulary")
        if not ids:
            raise InvalidOptionError(f"{name} is empty: an embedding needs at least one token of text")
        if len(ids) > embedder.n_ctx:
            if not truncate:
                raise ContextOverflowError(
                    f"{name} has {len(ids)} tokens, more than the embedding context holds ({embedder.n_ctx}): "
                    f"shorten it, or have it truncated to its first {embedder.n_ctx} (embed(truncate=True); "
                    "Ollama's /api/embed does)")
            tail = _added_tail(embedder, item) if isinstance(item, str) else []
            ids = ids[:embedder.n_ctx - len(tail)] + tail
        out.append(ids)
    return out


def _added_tail(embedder, text: str) -> List[int]:
    """The special tokens the tokenizer adds after a text (BERT's SEP, an EOS), found by tokenizing it without."""
    whole, bare = embedder.tokenize(text), embedder.tokenize(text, False)
    for start in range(len(whole) - len(bare) + 1):
        if whole[start:start + len(bare)] == bare:
            return whole[start + len(bare):]
    return []


def vectors(embedder, token_lists: List[List[int]], normalize: bool,
            stop: Optional[threading.Event] = None, gate=None) -> np.ndarray:
    """(len(token_lists), n_embd) float32; a stop set from another thread raises Cancelled before the next decode
    batch (64 rows of one input, or several short inputs together), as does the interpreter's exit (gate.exiting:
    a daemon thread inside llama.cpp as Python finalized died with SIGSEGV)."""
    other_thread = threading.current_thread() is not threading.main_thread()  # (an exit hook may still embed)

    def poll():
        if stop is not None and stop.is_set():
            raise Cancelled("the embedding was cancelled")
        if other_thread and gate is not None and gate.exiting:
            raise Cancelled("the interpreter is exiting: the embedding was stopped")

    try:
        return embedder.embed(token_lists, normalize, poll)
    finally:
        logs.drain()


MODEL_CTX = 8192  # an embedding model's longest input: this, or its training context if shorter


def check_path(path: Union[str, os.PathLike]) -> str:
    """An embedding model's path as a str, checked without loading it: TypeError, or ModelLoadError for a file that
    is not there or that llama.cpp would abort the process on."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"embedding_model must be a path or None, got {type(path).__name__}")
    path = _path("embedding_model", os.fspath(path))
    if not os.path.exists(path):
        raise ModelLoadError(f"embedding_model file not found: {path!r}; check the path")
    gguf_check.check_gguf(path)
    return path


def load(path: Union[str, os.PathLike], n_threads: int, n_gpu_layers: int):
    """An Embedder over an embedding model's GGUF (ModelLoadError if it is not one llama.cpp loads)."""
    path = check_path(path)
    opts = _core.ModelOptions()
    opts.path = path
    opts.n_ctx, opts.n_threads, opts.n_gpu_layers = MODEL_CTX, n_threads, n_gpu_layers
    try:
        return _core.Embedder(opts)
    finally:
        logs.drain()


class EmbedMethods:
    """LLM's embedding methods (a context of the target's, made at the first call, or the embedding model's)."""

    def embed(self, input: Input, *, normalize: bool = True, truncate: bool = False,
              stop: Optional[threading.Event] = None):
        """Embedding vectors (numpy float32) of a text or token id list (shape (n_embd,)) or of a list of those
        (shape (len(input), n_embd)), as /v1/embeddings serves them: with embedding_model, that model's (its
        GGUF's pooling); otherwise the mean of the target's last hidden states over the input's tokens, from a
        context of its own, so the conversation's KV cache stays. normalize: unit length (L2; cosine similarity
        is then a dot product). An input longer than the embedding context (n_ctx; an embedding model's training
        context at most) raises ContextOverflowError unless truncate (its first tokens are embedded). Waits for a
        running generation; a stop Event set from another thread raises Cancelled within one batch of 64 tokens."""
        out, _ = self.embed_counted(input, normalize=normalize, truncate=truncate, stop=stop)
        return out[0] if split(input)[1] else out

    def embed_counted(self, input: Input, *, normalize: bool = True, truncate: bool = False,
                      stop: Optional[threading.Event] = None) -> Tuple[np.ndarray, List[int]]:
        """embed()'s vectors, always one row per input, with the tokens each input was read as (a server's usage)."""
        items, _ = split(input)
        flag("normalize", normalize)
        flag("truncate", truncate)  # truncate="no" truncated
        with Call(self._gate):
            embedder = self._embedding()
            ids = tokens(embedder, items, truncate)
            return vectors(embedder, ids, normalize, stop, self._gate), [len(t) for t in ids]

    def embedding_tokens(self, input: Input, truncate: bool = False) -> List[List[int]]:
        """The tokens embed() reads for each input (the embedding model's own when there is one)."""
        flag("truncate", truncate)
        with Call(self._gate):
            return tokens(self._embedding(), split(input)[0], truncate)

    @property
    def embedding_info(self) -> dict:
        """What embed() computes with: model (the GGUF's path), n_embd, n_ctx (the longest input), pooling."""
        with Call(self._gate):
            e = self._embedding()
            return {"model": e.path, "n_embd": e.n_embd, "n_ctx": e.n_ctx, "pooling": e.pooling}

    def _embedding(self):  # under the gate
        if self._embedder is None:
            try:
                self._embedder = _core.Embedder(self._engine.target, self.n_ctx, self._opts.target.n_threads)
            finally:
                logs.drain()
        return self._embedder
