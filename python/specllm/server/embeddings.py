"""Embeddings over HTTP: OpenAI's /v1/embeddings (also /embeddings, as llama-server answers it) and Ollama's
/api/embed and legacy /api/embeddings, for the RAG tools of desktop assistants and editors that index documents
through the same server they chat with. Each request is a worker job like a generation (so it waits its turn on the
CPU instead of halving a running generation's speed), computed by LLM.embed; a client that goes away cancels it
within one batch of 64 tokens. With `serve --embedding-model`, that model answers (named by its file's name);
otherwise the chat model's own hidden states, mean-pooled."""
from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from contextlib import aclosing
from typing import List, Literal, Optional, Union

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from ..errors import DecodeError, SpecLLMError
from . import jobs
from .errors import APIError
from .worker import Job

router = APIRouter()
log = logging.getLogger("specllm.server")


class EmbedJob(Job):
    """A job of inputs to embed: its one event is ("result", (vectors, tokens per input)). dimensions (when asked
    for): the vectors' length, refused unless the model's own, or with cut (Ollama's) the first that many of each,
    normalized again."""

    def __init__(self, inputs, normalize: bool, truncate: bool, dimensions: Optional[int], cut: bool, loop, metrics):
        super().__init__([], {}, loop, metrics)
        self.inputs, self.normalize, self.truncate = inputs, normalize, truncate
        self.dimensions, self.cut = dimensions, cut
        self._stop = threading.Event()
        self._done = False  # its result is posted: a cancel then stops nothing

    def cancel(self, error=None) -> None:
        with self._lock:
            running = self.t_start is not None and not self.cancelled and not self._done
        super().cancel(error)
        self._stop.set()  # the running embedding stops before its next batch
        if running:
            self._metrics.cancelled.labels(stage="running").inc()

    def work(self, llm, metrics) -> None:
        n_embd = llm.embedding_info["n_embd"]
        if self.dimensions is not None and (self.dimensions > n_embd or not self.cut and self.dimensions != n_embd):
            raise DimensionsError(self.dimensions, n_embd)
        vectors, counts = llm.embed_counted(self.inputs, normalize=self.normalize, truncate=self.truncate,
                                            stop=self._stop)
        if self.dimensions is not None and self.dimensions < n_embd:
            vectors = vectors[:, :self.dimensions]
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        metrics.embedded_tokens.inc(sum(counts))
        with self._lock:
            self._done = True
        self.post("result", (vectors, counts))

    def failed(self, e: Exception) -> None:
        """A bad input (400) or a failed decode (500); nothing is posted for an embedding stopped by a cancel."""
        if not isinstance(e, (SpecLLMError, TypeError, DimensionsError)) or isinstance(e, DecodeError):
            log.exception("embedding failed")
        with self._lock:
            self._done = True  # ended: the follower's cancel then is not counted as a client gone
        if not self._stop.is_set():
            self.post("error", e)


class DimensionsError(Exception):
    def __init__(self, asked: int, n: int):
        super().__init__(f"dimensions {asked}: this model's embeddings have {n} dimensions; leave dimensions out")


def names(state) -> List[str]:
    """The model ids an embedding request may name: the embedding model's (its file's name without .gguf) when
    there is one, and the chat model's; the first is the one that embeds."""
    path = state.llm.embedding_model
    return list(dict.fromkeys(([] if path is None else [jobs.model_id(path)]) + [state.model_id]))  # once each


MAX_INPUTS = 2048  # inputs a request (OpenAI's bound): a list of 200,000 held the worker for 45 s


def _check(state, model: Optional[str], ollama: bool) -> str:
    """The id of the model that embeds (what the answer names); a 404 for a model this server does not serve."""
    ids = names(state)
    if (model or ollama) and not any(model in (i, f"{i}:latest") if ollama else model == i for i in ids):
        # Ollama's API names its model always ("" is a 404 there); OpenAI's may leave it out, as llama-server's
        raise APIError(404, f"the model {(model or '')[:200]!r} does not exist here; embeddings come from "
                            f"{' or '.join(repr(i) for i in ids)}", "invalid_request_error", "model",
                       "model_not_found")
    return ids[0]


async def _embed(request: Request, inputs, normalize: bool, truncate: bool, dimensions: Optional[int] = None,
                 cut: bool = False):
    """(vectors, tokens per input) of the inputs, computed on the worker; the API's error when it fails."""
    state = jobs.server_state(request)
    if isinstance(inputs, list) and len(inputs) > MAX_INPUTS and not isinstance(inputs[0], int):  # ints: one input
        raise APIError(400, f"input holds {len(inputs)} inputs; at most {MAX_INPUTS} a request (as OpenAI's API): "
                            "send them in several requests", "invalid_request_error", "input", "invalid_value")
    job = EmbedJob(inputs, normalize, truncate, dimensions, cut, asyncio.get_running_loop(), state.metrics)
    jobs.enqueue(state, job)
    result = None
    async with aclosing(jobs.follow(request, job, _error)) as events:
        async for _, value in events:  # its one "result"
            result = value
    if result is None:  # cancelled: the client is gone, nobody reads this
        raise jobs.client_gone()
    return result


def _error(e: BaseException) -> APIError:
    if isinstance(e, DimensionsError):
        return APIError(400, str(e), "invalid_request_error", "dimensions", "invalid_value")
    error = jobs.generation_error(e)
    if error.status == 400 and error.param is None:
        error.param = "input"  # what a bad embedding request can be wrong in
    elif error.status == 500:
        error.message = error.message.replace("the generation failed", "the embedding failed")
    return error


def _timed(request: Request, t0: float) -> None:
    jobs.server_state(request).metrics.request_seconds.labels(endpoint=request.url.path).observe(
        time.monotonic() - t0)


# --- OpenAI

class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: Union[str, List[str], List[StrictInt], List[List[StrictInt]]]  # true is not a token id
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)
    user: Optional[str] = None


def _encode(vector, fmt: str):
    if fmt == "base64":  # little-endian float32, as OpenAI's client decodes it (its default format)
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


@router.post("/v1/embeddings")
@router.post("/embeddings")
async def embeddings(request: Request, req: EmbeddingRequest):
    state = jobs.server_state(request)
    state.require_ready()
    t0 = time.monotonic()
    model = _check(state, req.model, ollama=False)
    vectors, counts = await _embed(request, req.input, normalize=True, truncate=False, dimensions=req.dimensions)
    n = sum(counts)
    _timed(request, t0)
    return await run_in_threadpool(lambda: JSONResponse({  # the lists and their JSON: 2048 inputs held the loop 1.3 s
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": n, "total_tokens": n}}))


# --- Ollama

class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    input: Union[str, List[str]] = ""  # none (or ""): Ollama's "load the model", answered with no embeddings
    truncate: bool = True
    dimensions: Optional[int] = Field(None, ge=1)
    options: Optional[dict] = None
    keep_alive: Optional[Union[str, int, float]] = None


class LegacyEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: str = ""
    options: Optional[dict] = None
    keep_alive: Optional[Union[str, int, float]] = None


@router.post("/api/embed")
async def ollama_embed(request: Request, req: EmbedRequest):
    """Ollama's: unit vectors, an input longer than the context cut to it unless truncate is false, dimensions
    shorter than the model's: the first that many of each vector, normalized again."""
    state = jobs.server_state(request)
    state.require_ready()
    t0 = time.monotonic()
    model = _check(state, req.model, ollama=True)
    if req.input in ("", []):
        return {"model": model, "embeddings": [], "total_duration": 0, "load_duration": 0, "prompt_eval_count": 0}
    vectors, counts = await _embed(request, req.input, normalize=True, truncate=req.truncate,
                                   dimensions=req.dimensions, cut=True)
    _timed(request, t0)
    took = int((time.monotonic() - t0) * 1e9)
    return await run_in_threadpool(lambda: JSONResponse({  # off the event loop: 2048 inputs held it 2 s
        "model": model, "embeddings": vectors.tolist(), "total_duration": took, "load_duration": 0,
        "prompt_eval_count": sum(counts)}))


@router.post("/api/embeddings")
async def ollama_embeddings(request: Request, req: LegacyEmbedRequest):
    """Ollama's legacy endpoint: one prompt, the vector not normalized (as Ollama's is not)."""
    state = jobs.server_state(request)
    state.require_ready()
    t0 = time.monotonic()
    _check(state, req.model, ollama=True)
    if not req.prompt:
        return {"embedding": []}
    vectors, _ = await _embed(request, [req.prompt], normalize=False, truncate=True)
    _timed(request, t0)
    return {"embedding": vectors[0].tolist()}
