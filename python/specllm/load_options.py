"""What LLM(...) and set_draft take, before anything loads: the arguments checked (check_arguments: what LLM(...)
would refuse, said without loading), the draft argument's defaults, and the options llama.cpp loads a model with."""
from __future__ import annotations

import inspect
import os
import types
from typing import Optional

from . import _core, gguf_check, memory
from .errors import IncompatibleDraftError, InvalidOptionError, ModelLoadError
from . import chat_template as chat_templates
from .options import check_load, flag, kv_cache
from .options import path as _path

DEFAULT = "default"  # draft=DEFAULT: a registry target's known draft, n-gram lookup for a path


def resolve(name_or_path: str) -> str:
    from . import registry
    return registry.resolve(name_or_path)


def default_draft(name_or_path: str) -> Optional[str]:
    """What draft=DEFAULT means for a target: a registry name's known draft; for a .gguf path, n-gram lookup in the
    prompt and output ("ngram"): it needs no second model and costs microseconds, and "auto" drafts only where it
    pays, so a model given by path speculates too (plain decoding for a path before 2026-11-26)."""
    if os.path.exists(name_or_path):
        return "ngram"
    from . import registry
    return registry.default_draft(name_or_path)


def draft_arg(model: str, draft, ngram):
    """(draft, ngram) with the defaults filled in: DEFAULT is a registry target's known draft; a draft model drafts
    with n-gram lookup beside it unless ngram=False (as in specllm-cli: "auto" uses n-grams only where they pay, and
    on a CPU where the draft model cannot pay they are all that can)."""
    if draft == DEFAULT:
        draft = default_draft(model)
    if ngram is None:
        ngram = draft not in (None, "ngram")
    flag("ngram", ngram)  # ngram="no" would have drafted with n-grams
    if draft is not None and not isinstance(draft, (str, os.PathLike)):
        raise TypeError(f"draft must be a path, a registry name, 'ngram' or None, got {type(draft).__name__}")
    word = draft.strip().lower() if isinstance(draft, str) else None
    if word in ("none", "ngram", "off") and draft != "ngram" and not os.path.exists(draft):
        # the CLI's spelling (--draft none) or a stray space: it was "unknown model 'none'"
        want, what = ("ngram", "n-gram lookup") if word == "ngram" else (None, "no drafter")
        raise InvalidOptionError(f"draft={draft!r}: no model is named so; for {what} pass draft={want!r}")
    return (_path("draft", os.fspath(draft)) if draft is not None else None), ngram


def checked(model, *, memory_file, cache_type_k, cache_type_v, flash_attn, chat_template, chat_template_kwargs,
             **load) -> tuple:
    """LLM(...)'s arguments checked before anything loads: (model, prompt_cache_dir, MemoryFile or None,
    kv_cache(...), the chat template's check_load_args)."""
    model, prompt_cache_dir = check_load(model, memory_file=memory_file, **load)
    memory_file = None if memory_file is None else memory.MemoryFile(_path("memory_file", os.fspath(memory_file)))
    kv = kv_cache(cache_type_k, cache_type_v, flash_attn)
    return model, prompt_cache_dir, memory_file, kv, chat_templates.check_load_args(chat_template, chat_template_kwargs)


def check_arguments(model, draft=DEFAULT, **kwargs) -> None:
    """What LLM(model, draft, **kwargs) refuses before it loads anything (TypeError, InvalidOptionError,
    MemoryFileError, ...), raised without loading: `specllm-cli serve` checks its flags so before it binds its
    port."""
    from .llm import LLM

    bound = inspect.signature(LLM.__init__).bind(None, model, draft, **kwargs)
    bound.apply_defaults()
    load = {k: v for k, v in bound.arguments.items() if k not in ("self", "draft", "ngram", "embedding_model")}
    model = checked(**load)[0]
    draft, ngram = draft_arg(model, draft, bound.arguments["ngram"])
    check_ngram_sizes(draft, ngram, types.SimpleNamespace(n_min=load["ngram_min"], n_max=load["ngram_max"]))
    for name in (model, draft):
        if name not in (None, "ngram"):
            check_found(name)
    if bound.arguments["embedding_model"] is not None:
        from . import embed

        embed.check_path(bound.arguments["embedding_model"])


def check_found(name: str) -> None:
    """A model path that does not exist (ModelLoadError, as the load says it) or a name the registry does not know
    (RegistryError, with the nearest names): a registry model not downloaded yet passes (the load pulls it)."""
    from . import registry

    if os.path.exists(name) or name in registry.known_models():
        return
    if name.endswith(".gguf") or os.sep in name or "/" in name:
        raise ModelLoadError(f"model file not found: {name!r}; check the path, or use a registry name")
    registry.cached_path(name)  # unknown: raises


def check_ngram_sizes(draft, ngram: bool, sizes) -> None:
    """Before any model loads: an index of these sizes refuses what the n-gram drafter would refuse."""
    if draft == "ngram" or (ngram and draft is not None):
        _core.NgramIndex(sizes.n_min, sizes.n_max)


def drafter_options(draft, ngram, n_gpu_layers, target):
    """(DraftKind, the draft model's ModelOptions) for draft None, "ngram" or a model's path or name."""
    if draft is None:
        return _core.DraftKind.none, _core.ModelOptions()
    if draft == "ngram":
        return _core.DraftKind.ngram, _core.ModelOptions()
    check_vocab_before_pull(draft, target.path)
    # the draft's numerics never reach the output: it may always use llama.cpp's batch kernels
    o = model_options(resolve(draft), target.n_ctx, target.n_threads, n_gpu_layers, target.n_batch, True)
    o.cache_type_k, o.cache_type_v, o.flash_attn = target.cache_type_k, target.cache_type_v, target.flash_attn
    return (_core.DraftKind.hybrid if ngram else _core.DraftKind.model), o


def check_vocab_before_pull(draft: str, target_path: str) -> None:
    """IncompatibleDraftError for a draft given by a registry name that is not downloaded yet and whose vocabulary
    (the registry's n_vocab) is not the target's: said at once, not after minutes of download (the loaded models'
    full check, Model's check_same_vocab, still runs for every draft)."""
    from . import registry
    if os.path.exists(draft):
        return
    entry = registry.known_models().get(draft)
    n_vocab = entry.get("n_vocab") if entry else None
    if not isinstance(n_vocab, int) or registry.cached_path(draft).is_file():
        return
    info = gguf_check.check_gguf(target_path)
    have = info.arrays.get("tokenizer.ggml.tokens") if info is not None else None
    if have is not None and abs(have - n_vocab) > _core.max_vocab_size_difference:
        raise IncompatibleDraftError(
            f"the draft model {draft!r} has a vocabulary of {n_vocab} tokens and the target {have}: it cannot draft "
            f"for this target (not downloaded); use a draft model of the same family (same tokenizer), or "
            f'draft="ngram"')


def model_options(path, n_ctx, n_threads, n_gpu_layers, n_batch, repack):
    gguf_check.check_gguf(path)  # a file llama.cpp would abort the process on is a ModelLoadError first
    o = _core.ModelOptions()
    o.repack = repack
    o.path = path
    o.n_ctx = n_ctx
    o.n_threads = n_threads or 0
    o.n_gpu_layers = n_gpu_layers
    o.n_batch = n_batch
    return o
