"""Fill in the middle (FIM): the prompt that asks a code model for the text between a prefix and a suffix (an
editor's cursor in a file), in the prefix-suffix-middle form FIM-trained models learned:

    <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>

after which the model writes the middle and ends it with an end-of-text token. The special tokens are the
vocabulary's own (llama.cpp finds them by metadata or by their text: Qwen2.5-Coder's <|fim_prefix|>, CodeLlama's
<PRE>, StarCoder's and Granite's <fim_prefix>, DeepSeek-Coder's, CodeGemma's). The prefix and suffix are text:
special tokens written in them stay text. Editors send whole files: what does not fit keeps the end of the prefix
and the start of the suffix (the suffix at most a quarter of the room when both are long), as llama-server's
/infill does."""
from __future__ import annotations

from typing import List

from .errors import InvalidOptionError


def prompt(model, prefix: str, suffix: str, room: int) -> List[int]:
    """The FIM prompt's tokens for `model` (a _core.Model), at most `room` of them. Raises InvalidOptionError for a
    model without FIM tokens or a room too small for the three of them and one token of text."""
    fim = model.fim_tokens
    missing = [name for name in ("pre", "suf", "mid") if fim[name] < 0]
    if missing:
        raise InvalidOptionError(f"suffix (fill in the middle) needs a model trained for it, with FIM tokens; this one "
                                 f"has no {'/'.join(missing)} token (code models such as Qwen2.5-Coder, CodeLlama, "
                                 f"StarCoder or DeepSeek-Coder have them)")
    bos = model.tokenize("", True, False)  # [bos] when the model adds one
    pre = model.tokenize(prefix, False, False)
    suf = model.tokenize(suffix, False, False)
    room -= len(bos) + 3
    if room < 1:
        raise InvalidOptionError("suffix: the context window has no room for a prefix and a suffix beside max_tokens; "
                                 "lower max_tokens or create the LLM with a larger n_ctx")
    if len(pre) + len(suf) > room:
        keep_suf = min(len(suf), max(room // 4, room - len(pre)))
        keep_pre = min(len(pre), room - keep_suf)
        pre, suf = pre[len(pre) - keep_pre:], suf[:keep_suf]
    return bos + [fim["pre"]] + pre + [fim["suf"]] + suf + [fim["mid"]]
