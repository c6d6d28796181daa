"""llama.cpp's log lines, captured by the core, go to logging.getLogger("specllm") (silent by default)."""
import logging

from . import _core

logger = logging.getLogger("specllm")
logger.addHandler(logging.NullHandler())

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def drain() -> None:
    for level, text in _core.log_drain():
        if text.startswith("specllm: "):  # the core's own notes
            logger.log(_LEVELS.get(level, logging.DEBUG), "%s", text[len("specllm: "):])
        else:
            logger.log(_LEVELS.get(level, logging.DEBUG), "llama.cpp: %s", text)
