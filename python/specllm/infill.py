"""Fill in the middle (FIM): the prompt that asks a code model for the text between a prefix and a suffix (an
editor's cursor in a file), in the prefix-suffix-middle form FIM-trained models learned:

    <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>

after which the model writes the middle and ends it with an end-of-text token. The special tokens are the
vocabulary's own (llama.cpp finds them by metadata or by their text: Qwen2.5-Coder's <|fim_prefix|>, CodeLlama's
<PRE>, StarCoder's and Granite's <fim_prefix>, DeepSeek-Coder's, CodeGemma's). The prefix and suffix are text:
special tokens written in them stay text. Editors send whole files: what does not fit keeps the end of the prefix
and the start of the suffix (the suffix at most a quarter of the room when both are long), as llama-server's
/infill does.

Editors also send other files' text (llama.vscode's and llama.vim's ring of chunks from open and edited files):
`extra`, put before the FIM prefix in the repo-level form Qwen2.5-Coder learned, as llama-server's /infill does
(arXiv 2409.12186):

    <FIM_REP>myproject\n <FIM_SEP>{filename}\n{text} ... <FIM_SEP>filename\n <FIM_PRE> ...

or, for a model without those tokens, each chunk after a "--- snippet ---" line. Extra text gets the room the
prefix, suffix and middle leave, keeping its end (the chunks last sent)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .errors import ContextOverflowError, InvalidOptionError

REPO = "myproject\n"  # llama-server's project name (the requests carry none)
SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's chunk separator for models without <FIM_SEP>


def check_model(model) -> None:
    """InvalidOptionError for a model (a _core.Model) without the FIM tokens a suffix needs."""
    fim = model.fim_tokens
    missing = [name for name in ("pre", "suf", "mid") if fim[name] < 0]
    if missing:
        raise InvalidOptionError(f"suffix (fill in the middle) needs a model trained for it, with FIM tokens; this one "
                                 f"has no {'/'.join(missing)} token (code models such as Qwen2.5-Coder, CodeLlama, "
                                 f"StarCoder or DeepSeek-Coder have them)")


def prompt(model, prefix: str, suffix: str, room: int, extra: Optional[Sequence[Tuple[str, str]]] = None,
           middle: str = "") -> List[int]:
    """The FIM prompt's tokens for `model` (a _core.Model), at most `room` of them. extra: (filename, text) chunks
    of other files, in the repo-level form (None: the plain form; a list, even empty, gives llama-server's layout,
    whose repo header the model sees on every request); middle: text the middle starts with (llama-server's
    `prompt`). Raises InvalidOptionError for a model without FIM tokens, ContextOverflowError for a room too small
    for them and one token of text."""
    check_model(model)
    fim = model.fim_tokens
    bos = model.tokenize("", True, False)  # [bos] when the model adds one
    pre = model.tokenize(prefix, False, False)
    suf = model.tokenize(suffix, False, False)
    mid = model.tokenize(middle, False, False) if middle else []
    room -= len(bos) + 3 + len(mid)
    if room < 1:
        what = f"the middle's start ({len(mid)} tokens)" if mid else "max_tokens"
        raise ContextOverflowError(f"suffix: the context window has no room for a prefix and a suffix beside {what}; "
                                   f"lower {'it' if mid else 'max_tokens'} or create the LLM with a larger n_ctx")
    if len(pre) + len(suf) > room:
        keep_suf = min(len(suf), max(room // 4, room - len(pre)))
        keep_pre = min(len(pre), room - keep_suf)
        pre, suf = pre[len(pre) - keep_pre:], suf[:keep_suf]
    head = _extra(model, fim, extra, room - len(pre) - len(suf)) if extra is not None else []
    return bos + head + [fim["pre"]] + pre + [fim["suf"]] + suf + [fim["mid"]] + mid


def _extra(model, fim: dict, extra: Sequence[Tuple[str, str]], room: int) -> List[int]:
    """The tokens of the repo-level head, the oldest cut first when they exceed `room`."""
    out: List[int] = []
    rep, sep = fim.get("rep", -1), fim.get("sep", -1)
    if rep >= 0:
        out += [rep] + model.tokenize(REPO, False, False)
    for filename, text in extra:
        if sep >= 0:
            out += [sep] + model.tokenize(filename + "\n", False, False)
        else:
            out += model.tokenize(SNIPPET, False, False)
        out += model.tokenize(text, False, False)
    if sep >= 0:
        out += [sep] + model.tokenize("filename\n", False, False)  # llama-server's name for the file edited
    return out[max(0, len(out) - room):]
