"""specllm.generate(): one call that loads the models once and reuses them while the arguments match."""
from __future__ import annotations

import difflib
import inspect
import os
import threading
from typing import Optional

from .llm import DEFAULT, LLM
from .options import GENERATE_KEYS, GENERATE_NAMES, OTHER_NAMES, split_kwargs
from .results import Completion

_LOAD_KEYS = frozenset(inspect.signature(LLM.__init__).parameters) - {"self", "model", "draft"}
_cache_lock = threading.Lock()
_cached: Optional[tuple] = None  # (key, LLM): one pair of models, they are large


def generate(prompt, model: str, draft=DEFAULT, **options) -> Completion:
    """Generate with model (path or registry name) and draft; keyword options go to LLM(...) (n_ctx,
    n_threads, n_gpu_layers, ...) or to LLM.generate (max_tokens, temperature, stop, draft_length, ...).
    Like LLM.generate, a plain text completion of prompt as given: no chat template is applied (as in
    llama-cpp-python). For a reply to a conversation use LLM(model, draft).chat(messages)."""
    global _cached
    gen_opts, load_opts = split_kwargs(options, GENERATE_KEYS)
    unknown = next((k for k in load_opts if k not in _LOAD_KEYS), None)
    if unknown is not None:  # neither LLM's nor generate's (it was "LLM.__init__() got an unexpected keyword
        # argument 'num_predict'", with no word of max_tokens)
        hint = OTHER_NAMES.get(unknown) or next(iter(difflib.get_close_matches(
            unknown, GENERATE_NAMES + tuple(sorted(_LOAD_KEYS)), n=1)), None)
        raise TypeError(f"unknown option {unknown!r}" + (f"; did you mean {hint!r}?" if hint else "") +
                        " (specllm.generate takes LLM(...)'s options and LLM.generate's)")
    # the process too: a forked worker (multiprocessing's 'fork') reused the parent's LLM, which refuses it
    key = (os.getpid(), str(model), str(draft), tuple(sorted(load_opts.items())))
    with _cache_lock:
        if _cached is None or _cached[0] != key:
            _cached = None  # free the old pair before loading the new one
            _cached = (key, LLM(model, draft, **load_opts))
        llm = _cached[1]
    return llm.generate(prompt, **gen_opts)
