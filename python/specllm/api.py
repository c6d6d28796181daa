"""specllm.generate(): one call that loads the models once and reuses them while the arguments match."""
from __future__ import annotations

import threading
from typing import Optional

from .llm import DEFAULT, LLM
from .options import GENERATE_KEYS, split_kwargs
from .results import Completion

_cache_lock = threading.Lock()
_cached: Optional[tuple] = None  # (key, LLM): one pair of models, they are large


def generate(prompt, model: str, draft=DEFAULT, **options) -> Completion:
    """Generate with model (path or registry name) and draft; keyword options go to LLM(...) (n_ctx,
    n_threads, n_gpu_layers, ...) or to LLM.generate (max_tokens, temperature, stop, draft_length, ...).
    Like LLM.generate, a plain text completion of prompt as given: no chat template is applied (as in
    llama-cpp-python). For a reply to a conversation use LLM(model, draft).chat(messages)."""
    global _cached
    gen_opts, load_opts = split_kwargs(options, GENERATE_KEYS)
    key = (str(model), str(draft), tuple(sorted(load_opts.items())))
    with _cache_lock:
        if _cached is None or _cached[0] != key:
            _cached = None  # free the old pair before loading the new one
            _cached = (key, LLM(model, draft, **load_opts))
        llm = _cached[1]
    return llm.generate(prompt, **gen_opts)
