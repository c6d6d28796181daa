"""Ollama's model routes: / (the ollama CLI's heartbeat, HEAD /), /api/tags, /api/ps, /api/show and /api/version,
which tell a client what this server serves and what the model can do; and check_model, which the chat and generate
routes ask whether a request names that model."""
from __future__ import annotations

import datetime
import json
import os
from typing import Any, Dict, Optional

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from .. import __version__
from . import embeddings, jobs
from . import tools as tool_calls
from .ollama_request import DEFAULTS, bad, thinks

router = APIRouter()
public = APIRouter()  # /, outside the API key (app.py)
API_VERSION = "0.12.11"  # the Ollama API version whose endpoints and fields these routes serve (logprobs: 0.12.11)
SIZES = {"Small": "S", "Medium": "M", "Large": "L"}


def _embedding_name(state) -> Optional[str]:
    """The embedding model's id with serve --embedding-model (None without one, or when it has the chat model's)."""
    ids = embeddings.names(state)
    return ids[0] if state.llm.embedding_model is not None and len(ids) > 1 else None


def check_model(state, name: str, what: str) -> None:
    """A 404 unless name is this server's model (with or without :latest); Ollama's 400 for the embedding model of
    serve --embedding-model, which does not `what` (chat, generate)."""
    if name in (state.model_id, f"{state.model_id}:latest"):
        return
    if not name:
        raise bad("model is required: the name /api/tags lists", "model")  # Ollama's words
    emb = _embedding_name(state)
    if emb is not None and name in (emb, f"{emb}:latest"):
        raise bad(f"{json.dumps(name)} does not support {what}", "model")
    raise bad(f"model '{name}' not found; this server serves '{state.model_id}' (GET /api/tags)", "model", 404)


def quantization(ftype: str) -> str:
    """Ollama's name of a file type from llama.cpp's ("Q4_K - Medium": Q4_K_M, "IQ4_XS - 4.25 bpw": IQ4_XS)."""
    ftype = ftype.removesuffix(" (guessed)").removeprefix("all ")  # "all F32"; a type guessed from the tensors
    head, _, tail = ftype.partition(" - ")
    if head == "IQ3_S mix":  # llama.cpp's name of IQ3_M
        return "IQ3_M"
    return f"{head}_{SIZES[tail]}" if tail in SIZES else head


def details(state) -> dict:
    """What Ollama says of a model, from llama.cpp's description ("qwen2 1.5B Q4_K - Medium")."""
    desc = state.llm._engine.target.description
    family, _, rest = desc.partition(" ")
    size, _, quant = rest.partition(" ")
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family], "parameter_size": size,
            "quantization_level": quantization(quant)}


def _card(state, path: Optional[str] = None, name: Optional[str] = None) -> dict:
    """/api/tags' entry of the chat model, or of the embedding model at path named name."""
    st = os.stat(path or state.llm.model_path)
    shown = details(state) if path is None else {"format": "gguf", "family": "", "families": []}
    name = name or state.model_id
    return {"name": f"{name}:latest", "model": f"{name}:latest",
            "modified_at": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat(),
            "size": st.st_size, "digest": f"{st.st_size:x}{int(st.st_mtime):x}", "details": shown}


def _cards(state) -> list:
    """The chat model's entry and, with serve --embedding-model, the embedding model's (embeddings.py)."""
    emb = _embedding_name(state)
    return [_card(state)] + ([] if emb is None else [_card(state, state.llm.embedding_model, emb)])


@public.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
async def running():
    # what clients look for (the ollama CLI's heartbeat is HEAD /); without the key, as /health: it tells nothing
    return "Ollama is running"


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(request: Request):
    state = jobs.server_state(request)
    state.require_ready()
    return {"models": _cards(state)}


@router.get("/api/ps")
async def ps(request: Request):
    state = jobs.server_state(request)
    state.require_ready()
    card = _card(state)
    return {"models": [dict(card, expires_at="2099-01-01T00:00:00Z", size_vram=0, context_length=state.llm.n_ctx)]}


@router.post("/api/show")
async def show(request: Request, body: Dict[str, Any]):
    state = jobs.server_state(request)
    state.require_ready()
    name = body.get("model") or body.get("name")
    if not isinstance(name, str):
        raise bad("model is required: the name /api/tags lists", "model")
    emb = _embedding_name(state)
    if emb is not None and name in (emb, f"{emb}:latest"):
        card = _cards(state)[1]  # the embedding model of serve --embedding-model: it embeds, nothing else
        return {"modelfile": "", "parameters": "", "template": "", "details": card["details"], "model_info": {},
                "capabilities": ["embedding"], "modified_at": card["modified_at"]}
    check_model(state, name, "show")
    shown = details(state)
    template = state.llm.chat_template
    with_tools = state.llm.chat_template_for([{"type": "function"}])  # a GGUF's tool_use template, if it has one
    capabilities = ["completion"] + (["tools"] if tool_calls.template_calls_tools(with_tools) else []) + (
        ["insert"] if state.llm._engine.target.fim_tokens.get("mid", -1) >= 0 else []) + (
        ["thinking"] if thinks(template) else [])
    return {"modelfile": "", "parameters": "\n".join(f"{k} {v}" for k, v in DEFAULTS.items()), "template": template,
            "details": shown, "model_info": {"general.architecture": shown["family"],
                                             f"{shown['family']}.context_length": state.llm.n_ctx},
            "capabilities": capabilities, "modified_at": _card(state)["modified_at"]}


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version():
    return {"version": API_VERSION, "specllm": __version__}
