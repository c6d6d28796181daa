"""Checks the keyword options of generate/stream/chat and turns them into the core's GenerateOptions."""
from __future__ import annotations

import difflib
import math
import numbers
import os
import random
from typing import Iterable, Mapping, Optional, Sequence, Union

from . import _core
from .errors import InvalidOptionError

DraftLength = Union[int, str]
POLICIES = {"auto": _core.PolicyKind.auto, "heuristic": _core.PolicyKind.heuristic}
AUTO_K_LIMIT = _core.AutoPolicy.n_max  # the longest draft "auto" and "heuristic" consider (48)


INT_MAX = 2**31 - 1  # the core's ints are C ints


def _int(name: str, value, lo: Optional[int] = None, hi: int = INT_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if lo is not None and value < lo:
        raise InvalidOptionError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise InvalidOptionError(f"{name} must be at most {hi}, got {value}")
    return int(value)


def text(name: str, value) -> str:
    """value, checked to be a str the core can take: a str with lone surrogates (bytes that were not UTF-8, read
    with errors="surrogateescape") has no UTF-8 form."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidOptionError(
            f"{name} is not valid Unicode: it holds {value[e.start:e.end]!r} at index {e.start} (a lone surrogate, "
            f"usually bytes that were not UTF-8); decode such input with errors='replace'") from None
    return value


def path(name: str, value) -> str:
    """A path given as a str, checked as text() does and for a NUL character, which no file name can hold (os's
    "embedded null byte" ValueError named no argument, and crashed the chat's /save and /draft)."""
    value = text(name, value)
    if "\x00" in value:
        raise InvalidOptionError(f"{name} {value!r} holds a NUL character, which no file name can; give the path "
                                 "without it")
    return value


FLOAT32_TINY = 1.401298464324817e-45  # the smallest float32 above 0


def flag(name: str, value) -> bool:
    """value, which must be a bool: "no" or 0 would have been taken as True or False by bool()."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__}")
    return value


def _float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _stops(stop) -> list:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise TypeError("stop must be a string or a list of strings")
    return [text("stop", s) for s in stop if s]


FLT_MAX = 3.4028234663852886e38  # the largest float32: the core's logits and biases


def _logit_bias(value) -> list:
    """{token id: bias} as the core's (id, bias) pairs: each bias is added to the token's logit (OpenAI's range is
    -100..100: -100 all but bans a token, 100 all but forces it); float("-inf") bans it."""
    if not isinstance(value, Mapping):
        raise TypeError(f"logit_bias must be a dict of token id -> bias, got {type(value).__name__}")
    pairs = []
    for token, bias in value.items():
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"logit_bias: keys are token ids (ints; llm.tokenize(text) gives a text's), got "
                            f"{token!r}")
        if not 0 <= token <= INT_MAX:
            raise InvalidOptionError(f"logit_bias: token id {token} is not in the model's vocabulary")
        b = _float(f"logit_bias[{token}]", bias)
        if math.isnan(b) or b > FLT_MAX:  # 1e308 is inf as the float the core adds
            raise InvalidOptionError(f"logit_bias[{token}] must be a finite number (or -inf to ban the token), "
                                     f"got {bias}")
        pairs.append((int(token), b if b >= -FLT_MAX else float("-inf")))  # -1e300: -inf as the core's float
    return pairs


def make_options(
    *,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    temperature_last: bool = False,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    penalty_last_n: int = 64,
    logit_bias: Optional[Mapping[int, float]] = None,
    seed: Optional[int] = None,
    stop: Union[str, Sequence[str], None] = None,
    draft_length: DraftLength = "auto",
    draft_p_min: float = 0.0,
    ignore_eos: bool = False,
    acceptance: str = "coupled",
    logprobs: Optional[int] = None,
    prompt_logprobs: Optional[int] = None,
    grammar: Optional[str] = None,
    grammar_triggers: Optional[Sequence[str]] = None,
    grammar_trigger_patterns: Optional[Sequence[str]] = None,
    cache_reuse: int = 0,
) -> "_core.GenerateOptions":
    o = _core.GenerateOptions()
    o.max_tokens = _int("max_tokens", max_tokens)
    if o.max_tokens < 0:
        raise InvalidOptionError(f"max_tokens must be >= 0 (0: process the prompt only), got {max_tokens}")
    o.cache_reuse = _int("cache_reuse", cache_reuse, lo=0)
    s = _core.SamplingOptions()
    s.temperature = _float("temperature", temperature)
    if not s.temperature >= 0 or s.temperature == float("inf"):
        raise InvalidOptionError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    s.top_k = _int("top_k", top_k)
    if s.top_k < 0:
        raise InvalidOptionError(f"top_k must be >= 0 (0 = no limit), got {top_k}")
    value = _float("top_p", top_p)
    if not 0 < value <= 1:
        raise InvalidOptionError(f"top_p must be in (0, 1] (1 = no limit), got {top_p}")
    s.top_p = max(value, FLOAT32_TINY)  # 1e-300 is 0 as a float32, which the sampler refuses: the top token only
    s.min_p = _float("min_p", min_p)
    if not 0 <= s.min_p <= 1:
        raise InvalidOptionError(f"min_p must be in [0, 1] (0 = off), got {min_p}")
    s.temperature_last = flag("temperature_last", temperature_last)
    # llama.cpp's repetition penalties over the last penalty_last_n tokens of the context, prompt included
    s.repeat_penalty = _float("repeat_penalty", repeat_penalty)
    if not 0 < s.repeat_penalty < float("inf"):
        raise InvalidOptionError(f"repeat_penalty must be a finite number > 0 (1 = off; 1.1 is common), got "
                                 f"{repeat_penalty}")
    for name, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        setattr(s, name, _float(name, value))
        if not math.isfinite(getattr(s, name)):  # as the core's float
            raise InvalidOptionError(f"{name} must be a finite number (0 = off), got {value}")
    s.penalty_last_n = _int("penalty_last_n", penalty_last_n, lo=-1)  # -1: the whole context, 0: off
    if logit_bias is not None:
        s.logit_bias = _logit_bias(logit_bias)
    if seed is None:
        seed = random.SystemRandom().randrange(2**63)
    s.seed = _int("seed", seed, lo=0, hi=None) % 2**64
    if acceptance not in ("coupled", "rejection"):
        raise InvalidOptionError(f"acceptance must be 'coupled' (a seed gives plain sampling's text, whatever is "
                                 f"drafted) or 'rejection' (rejection sampling), got {acceptance!r}")
    s.rejection = acceptance == "rejection"
    o.sampling = s
    o.stop = _stops(stop)
    if isinstance(draft_length, str):
        if draft_length not in POLICIES:
            raise InvalidOptionError(
                f"draft_length must be an int >= 0, 'auto' or 'heuristic', got {draft_length!r}")
        o.policy = POLICIES[draft_length]
        o.draft_length = AUTO_K_LIMIT
    else:
        o.policy = _core.PolicyKind.fixed
        o.draft_length = _int("draft_length", draft_length, lo=0, hi=AUTO_K_LIMIT)
    o.draft_p_min = _float("draft_p_min", draft_p_min)
    if not 0 <= o.draft_p_min <= 1:
        raise InvalidOptionError(f"draft_p_min must be in [0, 1], got {draft_p_min}")
    o.ignore_eos = flag("ignore_eos", ignore_eos)
    if logprobs is not None:  # how many of the most likely tokens to list beside each emitted token's logprob
        o.logprobs = _int("logprobs", logprobs, lo=0, hi=_core.max_top_logprobs)
    if prompt_logprobs is not None:  # the same for the prompt's tokens (an eval harness's loglikelihood)
        o.prompt_logprobs = _int("prompt_logprobs", prompt_logprobs, lo=0, hi=_core.max_top_logprobs)
    if grammar is not None:  # GBNF the output must follow (specllm.grammar.json() makes one for JSON)
        o.grammar = text("grammar", grammar)
        if not o.grammar.strip():
            raise InvalidOptionError("grammar is empty; pass GBNF rules with a 'root' rule, or grammar=None")
        if o.ignore_eos:
            raise InvalidOptionError("grammar cannot be combined with ignore_eos: a grammar ends the output where "
                                     "its text is complete")
    # a lazy grammar: free text until one of these words (or a match of one of the patterns), the grammar from it on
    for name, given in (("grammar_triggers", grammar_triggers), ("grammar_trigger_patterns", grammar_trigger_patterns)):
        if given is None:
            continue
        words = [given] if isinstance(given, str) else given
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) and w for w in words):
            raise InvalidOptionError(f"{name} must be a list of non-empty strings (where the grammar begins to "
                                     f"hold), got {given!r}")
        if words and o.grammar == "":
            raise InvalidOptionError(f"{name} need a grammar: they say where it begins to hold")
        # llama.cpp searches the output for each after every token; a word is also checked against the grammar
        limit = 256 if name == "grammar_triggers" else 16384
        if any(len(w) > limit for w in words):
            raise InvalidOptionError(f"each of {name} is at most {limit} characters, got one of "
                                     f"{max(len(w) for w in words)}")
        if any("\x00" in w for w in words):
            raise InvalidOptionError(f"{name} hold a NUL character, which llama.cpp reads as the end; leave it out")
        setattr(o, name, [text(name, w) for w in words])
    return o


GENERATE_NAMES = (  # LLM.generate's options: make_options's and suffix (test_infill)
    "max_tokens", "temperature", "top_k", "top_p", "min_p", "temperature_last", "repeat_penalty", "frequency_penalty",
    "presence_penalty", "penalty_last_n", "logit_bias", "seed", "stop", "draft_length", "draft_p_min",
    "ignore_eos", "acceptance", "logprobs", "prompt_logprobs", "grammar", "grammar_triggers",
    "grammar_trigger_patterns", "cache_reuse", "suffix")
GENERATE_KEYS = frozenset(GENERATE_NAMES)


# other libraries' names for generate()'s options: said in the error for an unknown one
OTHER_NAMES = {"n_predict": "max_tokens", "max_new_tokens": "max_tokens", "num_predict": "max_tokens",
               "repetition_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n",
               "stop_sequences": "stop", "random_seed": "seed", "n_probs": "logprobs", "top_logprobs": "logprobs"}


def check_names(options: dict) -> None:
    """TypeError for a generate() option that does not exist, with the name it has here (make_options' own error
    named make_options, which no caller calls)."""
    for name in options:
        if name not in GENERATE_KEYS:
            hint = OTHER_NAMES.get(name) or next(iter(difflib.get_close_matches(name, GENERATE_NAMES, n=1)), None)
            raise TypeError(f"unknown generation option {name!r}" + (f"; did you mean {hint!r}?" if hint else "")
                            + f" (the options: {', '.join(GENERATE_NAMES)})")


def split_kwargs(kwargs: dict, keys: Iterable[str]):
    keys = set(keys)
    return {k: v for k, v in kwargs.items() if k in keys}, {k: v for k, v in kwargs.items() if k not in keys}


CACHE_TYPES = tuple(_core.cache_types)  # llama-server's -ctk/-ctv names: f16, bf16, f32, q8_0, q4_0, ...
FLOAT_CACHE_TYPES = ("f16", "bf16", "f32")  # the rest are quantized
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1, False: 0, True: 1}


def kv_cache(cache_type_k, cache_type_v, flash_attn) -> tuple:
    """LLM(...)'s KV cache options checked: (type_k, type_v, flash_attn as the core's -1/0/1)."""
    for name, value in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if value not in CACHE_TYPES:
            raise InvalidOptionError(f"{name} must be one of {', '.join(CACHE_TYPES)}, got {value!r} (q8_0 halves "
                                     f"the cache's memory, with the least change to the output)")
    if not isinstance(flash_attn, (str, bool)) or flash_attn not in FLASH_ATTN:
        raise InvalidOptionError(f"flash_attn must be 'auto', 'on' or 'off' (or a bool), got {flash_attn!r}")
    fa = FLASH_ATTN[flash_attn]
    if fa == 0 and cache_type_v not in FLOAT_CACHE_TYPES:
        raise InvalidOptionError(f"a quantized V cache (cache_type_v={cache_type_v!r}) needs flash attention: "
                                 f"flash_attn='auto' or 'on', or cache_type_v='f16'")
    return cache_type_k, cache_type_v, fa


def check_load(model, *, n_ctx, n_batch, n_gpu_layers, draft_n_gpu_layers, n_threads, ngram_min, ngram_max,
               memory_tokens, memory_file, prompt_cache_mb, prompt_cache_dir, prompt_cache_disk_mb,
               learn_batch_costs, stream_idle_timeout, seed=None, exact=False, profile_costs=True):
    """LLM(...)'s arguments checked before anything loads (TypeError, InvalidOptionError): (model, prompt_cache_dir)
    as strs (prompt_cache_dir None when not given)."""
    for name, value in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_gpu_layers", n_gpu_layers),
                        ("ngram_min", ngram_min), ("ngram_max", ngram_max)):
        _int(name, value)
    if not 16 <= n_ctx <= _core.max_ctx:  # as the load says it
        raise InvalidOptionError(f"n_ctx must be between 16 and {_core.max_ctx}, got {n_ctx}")
    _int("memory_tokens", memory_tokens, lo=0)
    _int("prompt_cache_mb", prompt_cache_mb, lo=0)
    _int("prompt_cache_disk_mb", prompt_cache_disk_mb, lo=1)
    if prompt_cache_dir is not None:
        if not isinstance(prompt_cache_dir, (str, os.PathLike)):
            raise TypeError(f"prompt_cache_dir must be a path or None, got {type(prompt_cache_dir).__name__}")
        prompt_cache_dir = path("prompt_cache_dir", os.fspath(prompt_cache_dir))
        if not prompt_cache_dir:
            raise InvalidOptionError("prompt_cache_dir is empty: give a directory (made if missing), or None "
                                     "for no prompt states on disk")
        place = os.path.abspath(prompt_cache_dir)
        while not os.path.lexists(place) and os.path.dirname(place) != place:
            place = os.path.dirname(place)  # the directory's nearest existing part: it, or where it would be made
        if not os.path.isdir(place):
            raise InvalidOptionError(f"prompt_cache_dir {prompt_cache_dir!r} is not a directory and cannot be made one "
                                     f"({place} is not a directory): give a directory to keep prompt states in")
    if memory_file is not None and memory_tokens == 0:
        raise InvalidOptionError("memory_file keeps the drafting memory, which memory_tokens=0 turns off")
    flag("learn_batch_costs", learn_batch_costs)
    flag("exact", exact)  # exact="no" would have been True
    flag("profile_costs", profile_costs)
    if seed is not None:  # every call would have failed on it
        _int("seed", seed, lo=0, hi=None)
    if draft_n_gpu_layers is not None:
        _int("draft_n_gpu_layers", draft_n_gpu_layers)
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int)):
        raise TypeError(f"n_threads must be an int or None, got {type(n_threads).__name__}")
    if n_threads is not None and not 0 <= n_threads <= _core.max_threads:
        raise InvalidOptionError(f"n_threads must be between 0 (all cores) and {_core.max_threads}, got "
                                 f"{n_threads}; this machine has {os.cpu_count()} cores, None uses them all")
    if isinstance(stream_idle_timeout, bool) or not isinstance(stream_idle_timeout, numbers.Real):
        raise TypeError(f"stream_idle_timeout must be a number, got {type(stream_idle_timeout).__name__}")
    if not stream_idle_timeout > 0:
        raise InvalidOptionError(f"stream_idle_timeout must be > 0 seconds, got {stream_idle_timeout}")
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a path or a registry name, got {type(model).__name__}")
    return path("model", os.fspath(model)), prompt_cache_dir
