"""POST /infill: llama-server's code-completion endpoint, which editor plugins call (llama.vscode, llama.vim):
input_prefix, input_suffix, input_extra (other files' chunks, in the repo-level FIM form: specllm/infill.py) and
prompt (text the middle starts with), with llama-server's sampling defaults and its two FIM limits, n_indent and
t_max_predict_ms. The answer is llama-server's own form (native.py: content, stop_type, timings...), not OpenAI's."""
from __future__ import annotations

from typing import List, Optional

from fastapi import APIRouter, Request

from ..errors import ContextOverflowError, InvalidOptionError
from . import bias, jobs, native
from .errors import APIError
from .protocol import _Request

router = APIRouter()
ROOM = 256  # tokens kept free for the middle when n_predict is -1 (until the end of the middle or of the context)


class ExtraChunk(_Request):
    text: str
    filename: str = "tmp"


class InfillRequest(native.NativeFields):
    input_prefix: str
    input_suffix: str
    input_extra: List[ExtraChunk] = []
    prompt: str = ""
    grammar: Optional[str] = None  # refused (a middle is code)
    json_schema: Optional[dict] = None


@router.post("/infill")
async def infill(request: Request, req: InfillRequest):
    state, t0 = native.begin(request, req, dict(native.REFUSED, grammar=None, json_schema=None))
    n_predict = native.n_predict_of(req)

    def prepare():
        return (state.llm.infill_prompt(req.input_prefix, req.input_suffix,
                                        max_tokens=n_predict if n_predict > 0 else min(ROOM, state.llm.n_ctx // 4),
                                        extra=[(c.filename, c.text) for c in req.input_extra], middle=req.prompt),
                bias.parse(state.llm, req.logit_bias))
    try:
        tokens, logit_bias = await jobs.prepared(request, prepare)
    except ContextOverflowError:  # the FIM tokens, a token of text and the middle's start beside n_predict
        asked = n_predict > 0  # else a quarter of the context at most is kept for the reply: the middle is too long
        beside, fix = (f"n_predict {n_predict}", "lower n_predict") if asked else (
            "the prompt (the middle's start)", "shorten the prompt")
        raise APIError(400, f"the context of {state.llm.n_ctx} tokens has no room for a prefix and a suffix beside "
                            f"{beside}; {fix}", "invalid_request_error", "n_predict" if asked else "prompt",
                       "context_length_exceeded") from None
    except (InvalidOptionError, TypeError) as e:  # named by LLM.infill_prompt's argument: say the field's name
        word = str(e).split(" ", 1)[0]
        param = {"prompt": "input_prefix", "middle": "prompt", "extra": "input_extra"}.get(word.split("[")[0],
                                                                                            "input_suffix")
        raise APIError(400, f"{param}{str(e)[len(word):]}" if word in ("prompt", "suffix", "middle") else str(e),
                       "invalid_request_error", param, "invalid_value") from None
    return await native.answer(request, state, req, [tokens], "/infill", "input_prefix", t0=t0, logit_bias=logit_bias)
