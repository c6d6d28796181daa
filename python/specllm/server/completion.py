"""llama-server's native text endpoints, which front ends and scripts written for llama.cpp call (SillyTavern's
llama.cpp backend, llama.cpp's own examples). POST /completion (and /completions): `prompt` as text, token ids, or
both mixed, completed as given (no chat template), or a list of such prompts (answered one after another, as a list
of answers, or streamed with each event's "index"), with llama-server's sampling defaults, n_predict, stop, `grammar`
(GBNF) or `json_schema`, `ignore_eos`, `return_tokens`; the answer is llama-server's own form (native.py: content,
stop_type, timings...) with the prompt's text; `cache_prompt` is always on (the KV prefix is reused). POST /tokenize
and /detokenize (front ends count a prompt's tokens with them), GET /props (the context size, the chat template, the
default sampling)."""
from __future__ import annotations

from typing import List, Optional, Union

from fastapi import APIRouter, Request
from pydantic import StrictInt
from starlette.responses import JSONResponse

from .. import grammar as grammars
from ..errors import InvalidOptionError
from .. import __version__
from ..options import text as checked_text
from . import bias, choices, jobs, native
from .errors import APIError
from .protocol import _Request

router = APIRouter()


class CompletionRequest(native.NativeFields):
    prompt: Union[str, List[Union[str, int, List[Union[str, int]]]]]
    grammar: Optional[str] = None
    json_schema: Optional[dict] = None
    ignore_eos: bool = False
    return_tokens: bool = False
    cache_prompt: bool = True  # always: the KV prefix is reused
    id_slot: int = -1          # one slot
    n_keep: int = 0            # nothing is dropped from the context: a prompt that does not fit is a 400


MAX_PROMPTS = choices.MAX_CHOICES


def _bad_prompt(message: str) -> APIError:
    return APIError(400, message, "invalid_request_error", "prompt", "invalid_value")


def _one_prompt(llm, prompt) -> List[int]:
    """The tokens of one prompt: text (BOS added as the model wants), token ids, or a list mixing text and ids (the
    text's special tokens parsed, BOS only before a first text)."""
    if prompt == "" or prompt == []:
        raise _bad_prompt("prompt is empty; give some text or token ids")
    try:
        if isinstance(prompt, str) or all(isinstance(x, int) for x in prompt):
            tokens = llm.prompt_tokens(prompt)
        else:  # mixed
            tokens = []
            for i, part in enumerate(prompt):
                tokens += (llm.prompt_tokens(part) if i == 0 else llm.tokenize(part, False)) \
                    if isinstance(part, str) else llm.prompt_tokens([part])
    except (InvalidOptionError, TypeError) as e:
        raise _bad_prompt(f"prompt: {e}") from None
    if not tokens:
        raise _bad_prompt("prompt is empty; give some text or token ids")
    return tokens


def prompt_tokens(llm, prompt) -> List[List[int]]:
    """The prompts of a request, each as tokens, in llama-server's forms: one prompt (text, token ids, or a list
    mixing text and ids), or a list of several — texts, token lists or mixed lists, each one prompt (at most
    MAX_PROMPTS). A list of texts alone is several prompts, as llama-server reads it."""
    if isinstance(prompt, list) and prompt and (any(isinstance(x, list) for x in prompt)
                                                or all(isinstance(x, str) for x in prompt)):
        if len(prompt) > MAX_PROMPTS:
            raise APIError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}; send the rest in "
                                "another request", "invalid_request_error", "prompt", "invalid_value")
        return [_one_prompt(llm, [x] if isinstance(x, int) else x) for x in prompt]
    return [_one_prompt(llm, prompt)]


def _grammar(state, req: CompletionRequest) -> dict:
    if req.grammar is not None and req.json_schema is not None:
        raise APIError(400, "grammar and json_schema cannot be combined: give one of them", "invalid_request_error",
                       "grammar", "invalid_value")
    param = "grammar" if req.grammar is not None else "json_schema" if req.json_schema is not None else None
    if param is None:
        return {}
    try:
        rules = req.grammar if param == "grammar" else grammars.json(req.json_schema)
        state.llm.check_options(grammar=rules)
    except (InvalidOptionError, TypeError) as e:
        raise APIError(400, str(e), "invalid_request_error", param, "invalid_value") from None
    if req.ignore_eos:
        raise APIError(400, f"{param} cannot be combined with ignore_eos: a grammar ends the output where its text "
                            "is complete", "invalid_request_error", "ignore_eos", "invalid_value")
    return {"grammar": rules}


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request, req: CompletionRequest):
    state, t0 = native.begin(request, req)

    def prepare():
        prompts = prompt_tokens(state.llm, req.prompt)
        texts = [state.llm.detokenize(tokens, special=True) for tokens in prompts]  # BOS's text too, as llama-server
        return prompts, _grammar(state, req), texts, bias.parse(state.llm, req.logit_bias)
    prompts, extra, texts, logit_bias = await jobs.prepared(request, prepare)
    if req.ignore_eos:
        extra["ignore_eos"] = True
    return await native.answer(request, state, req, prompts, request.url.path, "prompt", extra=extra,
                               settings_extra={"ignore_eos": req.ignore_eos, "grammar": extra.get("grammar", "")},
                               body_extra=lambda index, generated: {"prompt": texts[index]},
                               return_tokens=req.return_tokens, t0=t0, logit_bias=logit_bias)


class TokenizeRequest(_Request):
    content: Union[str, List[Union[str, StrictInt]], None] = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Request):
    tokens: List[StrictInt] = []


@router.post("/tokenize")
async def tokenize(request: Request, req: TokenizeRequest):
    """{"tokens": ids} of `content` (text, or text and ids mixed), as llama-server's; with_pieces: each as
    {"id", "piece"} (the piece's text, a control token's too, or its bytes where they are not UTF-8)."""
    state = native.ready(request)
    llm = state.llm
    parts = [req.content] if isinstance(req.content, str) else req.content or []

    def tokens_of_parts() -> list:
        tokens = []
        for i, part in enumerate(parts):
            if isinstance(part, str):
                tokens += llm._engine.target.tokenize(checked_text("content", part), req.add_special and i == 0,
                                                      req.parse_special)
            else:
                tokens += llm.prompt_tokens([part])
        return tokens

    def answer() -> JSONResponse:
        tokens = tokens_of_parts()
        if not req.with_pieces:
            return JSONResponse({"tokens": tokens})
        out = []
        for t in tokens:
            b = llm.token_bytes(t, special=True)  # a control token's text, as llama-server's
            try:
                piece = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return JSONResponse({"tokens": out})

    # in a thread, the answer's JSON too: a long word takes llama.cpp's tokenizer seconds, a megabyte's pieces and
    # their JSON took 5 s on the event loop (another client's stream stalled 6 s), and other clients are served
    # meanwhile
    try:
        return await jobs.off_loop(request, None, answer)
    except (InvalidOptionError, TypeError) as e:
        raise APIError(400, f"content: {e}", "invalid_request_error", "content", "invalid_value") from None


@router.post("/detokenize")
async def detokenize(request: Request, req: DetokenizeRequest):
    state = native.ready(request)
    try:  # in a thread: 900k ids held the event loop 0.4 s
        return await jobs.off_loop(request, None,  # control tokens' text too, as llama-server's
                                   lambda: JSONResponse({"content": state.llm.detokenize(req.tokens, special=True)}))
    except (InvalidOptionError, TypeError) as e:
        raise APIError(400, f"tokens: {e}", "invalid_request_error", "tokens", "invalid_value") from None


@router.get("/props")
async def props(request: Request):
    """llama-server's server properties: what front ends read (n_ctx, the chat template, the default sampling)."""
    state = native.ready(request)
    llm = state.llm
    target = llm._engine.target
    return {
        "default_generation_settings": {"n_ctx": llm.n_ctx, "params": dict(native.DEFAULTS, n_predict=-1, seed=-1)},
        "total_slots": 1, "model_alias": state.model_id, "model_path": llm.model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True,
        "chat_template": llm.chat_template, "bos_token": target.bos_text, "eos_token": target.eos_text,
        "build_info": f"specllm {__version__}", "is_sleeping": False,
    }
