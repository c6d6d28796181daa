"""What every bench tool checks before it loads a model, and how it writes and stops.

Bad arguments: argparse types (positive_int, ...) and names_in(), which end in parser.error (exit 2). Bad files and
an unusable output folder: fail(), one line "error: ..." on stderr, exit 1. Results are written whole or not at all
(write_text, write_bytes: specllm.files.write_atomic), a set of them all or none (write_all); a measuring run keeps
its records in a log until they are (records_log, write_results). Ctrl-C: interrupted(), one line, exit 130.
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


def write_all(out: Path, stem: str, outputs: dict) -> dict:
    """Writes <stem>.<ext> into out for each {ext: text or bytes}, all or none: an error, Ctrl-C or SIGTERM midway
    removes those already written (a reader never finds a .json without its .md). {ext: path}."""
    paths = {ext: Path(out) / f"{stem}.{ext}" for ext in outputs}
    try:
        for ext, data in outputs.items():
            write_bytes(paths[ext], data.encode("utf-8") if isinstance(data, str) else data)
    except BaseException:
        for path in paths.values():
            path.unlink(missing_ok=True)
        raise
    return paths


# --- a measuring tool's records log and results: <out>/<stem>.records.jsonl while it runs, then <stem>.json, ...

LOG_SUFFIX = ".records.jsonl"


def records_log(out: Path, name: str, started) -> Path:
    """The records log of a new run in out (made now): <name>.records.jsonl, or <name>-2..., the first name with
    neither results nor a run in progress; started(path) is told it (measured() says it on Ctrl-C)."""
    stem, n = name, 1
    while any((Path(out) / f"{stem}{ext}").exists() for ext in (".json", LOG_SUFFIX)):
        n += 1
        stem = f"{name}-{n}"
    made_out_dir(out)
    log_path = Path(out) / f"{stem}{LOG_SUFFIX}"
    started(log_path)
    return log_path


def nothing_measured(log_path: Path, why: str) -> NoReturn:
    """fail() for a run without a record: its empty log removed."""
    log_path.unlink(missing_ok=True)
    fail(f"nothing was measured: {why} (see above); no results written")


def write_results(log_path: Path, outputs: dict) -> dict:
    """write_all() beside the records log, with its stem, and then the log removed; when they cannot be written
    (fail()), or on Ctrl-C or SIGTERM, none are left and the log is kept."""
    out, stem = log_path.parent, log_path.name[:-len(LOG_SUFFIX)]
    try:
        paths = write_all(out, stem, outputs)
    except OSError as e:
        fail(f"cannot write the results to {out}: {e.strerror or e}; the records measured are kept in {log_path}")
    log_path.unlink()
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return paths


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
