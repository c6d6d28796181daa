"""llama.cpp's log lines, captured by the core, go to logging.getLogger("specllm"), the core's own notes (a prompt
state that could not be written, a damaged one removed, drafting turned off) to its child "specllm.core" (silent by
default; specllm-cli shows the notes on stderr)."""
import logging

from . import _core

logger = logging.getLogger("specllm")
logger.addHandler(logging.NullHandler())
core = logging.getLogger("specllm.core")

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def drain() -> None:
    for level, text in _core.log_drain():
        if text.startswith("specllm: "):  # the core's own notes
            core.log(_LEVELS.get(level, logging.DEBUG), "%s", text[len("specllm: "):])
        else:
            logger.log(_LEVELS.get(level, logging.DEBUG), "llama.cpp: %s", text)
