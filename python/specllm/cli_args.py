"""specllm-cli's flags: the argument types (each a message argparse prints on a bad value) and the groups of flags
the commands share (the model and how it loads; generation). cli.py builds the parser from them."""
from __future__ import annotations

import argparse
import json
import math

from .llm import DEFAULT
from .options import AUTO_K_LIMIT, CACHE_TYPES

DEFAULT_MODEL = "qwen2.5-coder-1.5b"


def positive_int(s: str) -> int:
    n = int(s)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def nonnegative_int(s: str) -> int:
    n = int(s)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def nonnegative_float(s: str) -> float:
    v = float(s)
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def _temperature(s: str) -> float:
    t = float(s)
    if not 0 <= t < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 = greedy), got {s}")
    return t


def _finite(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {s}")
    return v


def _repeat_penalty(s: str) -> float:
    v = float(s)
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 (1 = off), got {s}")
    return v


def _last_n(s: str) -> int:
    n = int(s)
    if n < -1:
        raise argparse.ArgumentTypeError(f"must be >= -1 (-1 = the whole context, 0 = off), got {n}")
    return n


def _draft_length(s: str):
    if s in ("auto", "heuristic"):
        return s
    try:
        k = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, heuristic or an int from 0 to {AUTO_K_LIMIT}, got {s!r}") \
            from None
    if not 0 <= k <= AUTO_K_LIMIT:  # the library's bound (it said 16 where generate() and the server take 48)
        raise argparse.ArgumentTypeError(f"must be from 0 to {AUTO_K_LIMIT}, got {k}")
    return k


def _draft(s: str):
    return None if s.lower() == "none" else "ngram" if s.lower() == "ngram" else s


def _seed(s: str):
    try:
        seed = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {s!r}") from None
    if not -1 <= seed < 2**64:  # it wrapped modulo 2^64
        raise argparse.ArgumentTypeError(f"must be from 0 to 2^64-1 (or -1: a fresh seed), got {seed}")
    return None if seed == -1 else seed


def _template_kwargs(s: str) -> dict:
    try:
        value = json.loads(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): give an object, e.g. '{{\"enable_thinking\": false}}'")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("give a JSON object of the template's variables, e.g. "
                                         "'{\"enable_thinking\": false}'")
    return value


def _template_file(s: str) -> str:
    try:
        with open(s, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read the template: {e}")


def chat_template_option(args):
    """--chat-template or the text of --chat-template-file (None when neither is given)."""
    return args.chat_template if args.chat_template is not None else args.chat_template_file


def model_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    load_args(p)
    generation_args(p, max_tokens)


def load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help=f"target model: registry name or .gguf path (default: {DEFAULT_MODEL})")
    g.add_argument("--draft", "-d", type=_draft, default=DEFAULT, metavar="none|ngram|NAME|PATH",
                   help="drafter: none (plain decoding), ngram (prompt lookup), or a draft model with the target's "
                        "vocabulary (default: the registry's draft for a registry target, ngram for a path)")
    g.add_argument("--ngram", action=argparse.BooleanOptionalAction, default=None,
                   help="hybrid drafting: with a draft model, also draft by n-gram lookup when it pays better "
                        "(default: on; --no-ngram: the draft model alone)")
    g.add_argument("--ctx", type=positive_int, default=4096, metavar="N",
                   help="context window, rounded up to a multiple of 256 as llama.cpp does (default: 4096)")
    g.add_argument("--threads", "-t", type=positive_int, default=None, metavar="N",
                   help="CPU threads (default: llama.cpp's choice)")
    g.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                   help="greedy output equal to plain decoding (slower verification on a CPU; default: the "
                        "library's, see README)")
    g.add_argument("--memory-tokens", type=nonnegative_int, default=None, metavar="N",
                   help="drafting memory: earlier replies the n-gram drafter looks up, at most N tokens "
                        "(0 = off; default: the library's)")
    g.add_argument("--prompt-cache-mb", type=nonnegative_int, default=None, metavar="N",
                   help="keep KV states of earlier prompts, at most N MiB, so that switching between "
                        "conversations does not decode them again (0 = off; default: the library's)")
    g.add_argument("--prompt-cache-dir", default=None, metavar="DIR",
                   help="keep prompt states in DIR across runs (made if missing): a long system prompt or a chat "
                        "taken up again is read back instead of decoded (default: none)")
    g.add_argument("--prompt-cache-disk-mb", type=positive_int, default=None, metavar="N",
                   help="at most N MiB of states in --prompt-cache-dir, least recently used out first (default: "
                        "the library's, 4096)")
    g.add_argument("--memory-file", default=None, metavar="PATH",
                   help="keep the drafting memory in PATH across runs: read at start if it exists, saved after "
                        "every reply")
    g.add_argument("--cache-type-k", "-ctk", choices=CACHE_TYPES, default=None, metavar="TYPE",
                   help="KV cache type for K, the target's and the draft model's, as llama-server's: "
                        f"{', '.join(CACHE_TYPES)} (default: f16; q8_0 for K and V halves the cache's memory)")
    g.add_argument("--cache-type-v", "-ctv", choices=CACHE_TYPES, default=None, metavar="TYPE",
                   help="KV cache type for V (default: f16; a quantized one needs flash attention)")
    g.add_argument("--flash-attn", "-fa", choices=("auto", "on", "off"), default=None,
                   help="flash attention (default: auto, llama.cpp's choice for the device)")
    t = g.add_mutually_exclusive_group()
    t.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help="the chat template to format conversations with instead of the model's own: a Jinja "
                        "template, or a llama.cpp built-in name (chatml, llama3, gemma, ...)")
    t.add_argument("--chat-template-file", type=_template_file, default=None, metavar="PATH",
                   help="as --chat-template, read from a file")
    g.add_argument("--chat-template-kwargs", type=_template_kwargs, default=None, metavar="JSON",
                   help="the chat template's own variables, as a JSON object (e.g. '{\"enable_thinking\": false}' "
                        "for Qwen3's)")
    g.add_argument("--learn-batch-costs", action="store_true", default=None,
                   help="let \"auto\" learn what verify batches cost now from their timing (follows a machine whose "
                        "load changes; the choices then move with the clock; default: off, see README)")


def generation_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("--temperature", type=_temperature, default=0.0, metavar="T",
                   help="sampling temperature (default: 0 = greedy)")
    g.add_argument("--max-tokens", type=positive_int, default=max_tokens, metavar="N",
                   help=f"longest reply (default: {max_tokens})")
    g.add_argument("--draft-length", type=_draft_length, default="auto", metavar="auto|heuristic|K",
                   help=f"draft tokens per step: auto (cost model, default), heuristic, or a fixed K (0-{AUTO_K_LIMIT})")
    g.add_argument("--seed", type=_seed, default=None, metavar="N",
                   help="sampling seed, from 0 to 2^64-1 (default, or -1 as in llama.cpp: a fresh one)")
    g.add_argument("--repeat-penalty", type=_repeat_penalty, default=1.0, metavar="F",
                   help="divide the logits of tokens seen in the last --repeat-last-n tokens by F, as llama.cpp "
                        "(default: 1.0, off; 1.1 keeps small models from looping)")
    g.add_argument("--repeat-last-n", type=_last_n, default=64, metavar="N",
                   help="tokens of prompt and reply the penalties look back over (default: 64; -1: all)")
    g.add_argument("--presence-penalty", type=_finite, default=0.0, metavar="F",
                   help="subtract F from the logits of tokens seen there (default: 0)")
    g.add_argument("--frequency-penalty", type=_finite, default=0.0, metavar="F",
                   help="subtract F times their count there (default: 0)")
    g.add_argument("--system", "-s", default=None, metavar="TEXT", help="system prompt")
