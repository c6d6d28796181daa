"""specllm-cli's messages on stderr: an error as one line, in the command line's words (the library's argument
names as flags), and the library's notes (the first load's measurement, a memory file not saved) shown as they come."""
from __future__ import annotations

import logging
import re
import sys

from . import registry

PROG = "specllm-cli"
MEASURING_THREAD = "specllm-measure"  # chat's measurement while the user types: its notes stay off the prompt


# control characters a reply may hold, shown as cat -v shows them on a terminal: an escape sequence in a model's
# reply (a prompt can ask for one) would otherwise reach the terminal — colours, the title, the clipboard (OSC 52)
_SHOWN = {c: "^" + chr(c + 64) for c in range(32) if c not in (9, 10, 13)}
_SHOWN.update({0x7F: "^?", **{c: f"\\x{c:02x}" for c in range(0x80, 0xA0)}})


def for_terminal(text: str) -> str:
    """text as a terminal shows it without acting on it: line breaks, carriage returns and tabs kept, other control
    characters (ESC, BEL, C1 controls) written visibly."""
    return text.translate(_SHOWN)


def valid_text(s: str) -> str:
    """An argument with bytes that are not UTF-8 (Python holds them as lone surrogates) with U+FFFD in their place."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# the library's words for what the command line calls by its flags (an error from LLM(...) names its argument)
FLAG_WORDS = [
    ("create the LLM with a larger n_ctx", "give a larger --ctx"), ("pass the formatted prompt to generate() instead",
                                                                   "--raw completes the prompt as given"),
    ("None uses them all", "leaving --threads out uses them all"), ("between 0 (all cores) and", "between 1 and"),
    ("give chat_template= one of", "give --chat-template one of"), ("save one with LLM.save_memory",
                                                                   "--memory-file writes one at exit"),
]
FLAG_NAMES = {"port": "--port", "n_ctx": "--ctx", "n_threads": "--threads", "max_tokens": "--max-tokens", "memory_tokens": "--memory-tokens",
              "prompt_cache_mb": "--prompt-cache-mb", "prompt_cache_disk_mb": "--prompt-cache-disk-mb",
              "cache_type_k": "--cache-type-k", "cache_type_v": "--cache-type-v", "flash_attn": "--flash-attn",
              "chat_template": "--chat-template", "chat_template_kwargs": "--chat-template-kwargs", "draft_length": "--draft-length",
              "repeat_penalty": "--repeat-penalty", "penalty_last_n": "--repeat-last-n",
              "prompt_cache_dir": "--prompt-cache-dir", "memory_file": "--memory-file",
              "embedding_model": "--embedding-model", "temperature": "--temperature",
              "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty"}


def in_flags(message: str) -> str:
    """An error's text with the library's argument names as the command line's flags (n_ctx: --ctx, ...)."""
    for words, flags in FLAG_WORDS:
        message = message.replace(words, flags)
    # not inside a path, a dotted name or quotes (a file, a model or a template's own words stay as they are)
    return re.sub(r"(?<![\w./\\'\"-])(" + "|".join(FLAG_NAMES) + r")(?:(=)(?=['\"])|(?![\w(/\\'\"]|\.\w))",
                  lambda m: FLAG_NAMES[m.group(1)] + (" " if m.group(2) else ""), message)


def error(error) -> None:
    # a registry error names no option of the library, and quotes other tools (pip's "port=9" is not --port)
    message = str(error) if isinstance(error, registry.RegistryError) else in_flags(str(error))
    first, *rest = message.strip().splitlines() or ["(no message)"]
    print(f"{PROG}: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is at each record (a test harness or a caller may swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def stderr_handler() -> logging.Handler:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    # chat's measurement while the user types (chat_screen.IdleMeasure) would write into the line being typed
    handler.addFilter(lambda record: record.threadName != MEASURING_THREAD)
    handler.specllm_cli = True
    return handler


NOTE_LOGGERS = ("specllm.profile", "specllm.memory", "specllm.core", "specllm.registry")  # what every command shows on stderr (INFO)


def show_notes() -> None:
    """The first load on a machine measures verify costs (10-20 s on a 2-core CPU): say so on stderr; and a
    --memory-file that could not be saved."""
    for name in NOTE_LOGGERS:
        log = logging.getLogger(name)
        if not any(getattr(h, "specllm_cli", False) for h in log.handlers):
            log.addHandler(stderr_handler())
            log.setLevel(logging.INFO)
