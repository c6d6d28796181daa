"""What every bench tool checks before it loads a model, and how it writes and stops.

Bad arguments: argparse types (positive_int, ...) and names_in(), which end in parser.error (exit 2). Bad files and
an unusable output folder: fail(), one line "error: ..." on stderr, exit 1. Results are written whole or not at all
(write_text, write_bytes: specllm.files.write_atomic). Ctrl-C: interrupted(), one line, exit 130.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import tempfile
from pathlib import Path
from typing import NoReturn


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def _int(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what} (got {value})")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1 (--rounds, --limit, --max-tokens, ...)."""
    return _int(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: a whole number of at least 0 (--skip)."""
    return _int(text, 0, "at least 0")


def non_negative_float(text: str) -> float:
    """argparse type: a number of at least 0 (--temperature)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 (got {text})")
    return value


def names_in(parser: argparse.ArgumentParser, flag: str, value: str, known) -> list[str]:
    """A comma-separated list of names from `known`: at least one, none unknown (else parser.error)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        parser.error(f"{flag} is empty: give some of {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"{flag}: unknown {', '.join(map(repr, unknown))}: expected some of {', '.join(known)}")
    return names


def readable_file(text: str) -> Path:
    """argparse type: an existing file (not a folder) that can be read."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable (permission denied)")
    return path


def out_dir(path: Path, flag: str = "--out") -> Path:
    """The output folder checked before any model is loaded (else fail()): an existing folder that takes a file, or
    one that can be made in its nearest existing parent (made_out_dir() makes it when the results come)."""
    path = Path(path)
    base = path
    while not base.exists() and base != base.parent:
        base = base.parent
    why = None
    if not base.is_dir():
        why = f"{base} is a file, not a folder"
    elif base == path:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
                pass
        except OSError as e:
            why = e.strerror or str(e)
    elif not os.access(base, os.W_OK | os.X_OK):
        why = f"cannot make a folder in {base} (read-only or permission denied)"
    if why:
        fail(f"cannot write results to {flag} {path}: {why}; give a writable folder")
    return path


def made_out_dir(path: Path, flag: str = "--out") -> Path:
    """out_dir(), made (with its parents) now."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot make {flag} {path}: {e.strerror or e}")
    return Path(path)


def write_bytes(path: Path, data: bytes) -> None:
    """Writes a result whole or not at all (an interrupted write leaves the old file, or none)."""
    from specllm.files import write_atomic

    write_atomic(path, data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def sigterm_exits() -> None:
    """SIGTERM ends the tool as SystemExit(143), so that its cleanup runs (bench.serve's server is stopped, a llama.cpp
    anchor killed by subprocess.run): killed by the signal's default action, it left them running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def measured(run) -> int:
    """run(started) (started(path) is told the records log's path once there is one), Ctrl-C said by interrupted()."""
    log_path = []
    try:
        return run(log_path.append)
    except KeyboardInterrupt:
        return interrupted(log_path[-1] if log_path else None)


def interrupted(partial: Path | None = None) -> int:
    """Ctrl-C: one line instead of a traceback; the exit status of a SIGINT (130)."""
    kept = f"; the records measured so far are in {partial}" if partial is not None and Path(partial).exists() else ""
    print(f"interrupted{kept}", file=sys.stderr)
    return 130
