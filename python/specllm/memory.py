"""The drafting memory on disk: earlier generations' outputs (token ids, -1 between outputs), so that a new process
drafts from what an earlier one wrote.

File layout: a magic line, a JSON header line ({"version", "n_vocab", "vocab", "model", "n_tokens"}; "vocab" the
digest of the token texts, Model.vocab_hash: two vocabularies of one size hold other tokens behind the same ids),
then n_tokens int32 little-endian ids. Written to a temporary file and renamed, so a crash never leaves half a file."""
from __future__ import annotations

import json
import logging
import os
import stat
from typing import List, Optional, Union

import numpy as np

from . import files
from .errors import MemoryFileError
from .options import path as _path
from .gate import Call

log = logging.getLogger("specllm.memory")  # specllm-cli shows this one on stderr

MAGIC = b"SPECLLM-DRAFTING-MEMORY\n"
VERSION = 1


def save(path: str, tokens: List[int], n_vocab: int, model: str, vocab: Optional[str] = None) -> None:
    header = json.dumps({"version": VERSION, "n_vocab": n_vocab, "vocab": vocab, "model": os.path.basename(model),
                         "n_tokens": len(tokens)}).encode() + b"\n"
    files.write_atomic(path, MAGIC + header + np.asarray(tokens, dtype="<i4").tobytes(), new_mode=0o600)  # outputs


HEADER_MAX = 1 << 16  # the header line's most bytes (one written is ~100): a file with no line end soon is not one


def load(path: str, n_vocab: Optional[int], keep: Optional[int] = None, vocab: Optional[str] = None) -> List[int]:
    """The tokens of a saved memory; keep: at most the newest keep + 1 of them are read (an LLM keeps memory_tokens:
    a file saved with a larger bound costs no more to load; the one before them tells where an output began).
    n_vocab None: the file's form only (before a model is loaded); vocab: the model's vocab_hash (a file that names
    another is refused; one written before 2026-12-08 names none). OSError when it cannot be read; MemoryFileError for
    what is not a memory this vocabulary takes (a FIFO or a device too: a FIFO hung the read). Reads only the magic,
    the header and the tokens it keeps: a model file given by mistake is refused after its first bytes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MemoryFileError(f"{path} is not a regular file; give the path of a drafting memory file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        if f.read(len(MAGIC)) != MAGIC:
            raise MemoryFileError(f"{path} is not a specllm drafting memory (save one with LLM.save_memory)")
        line = f.readline(HEADER_MAX)
        try:
            if not line.endswith(b"\n"):
                raise ValueError("no header line")
            header = json.loads(line)
            n = int(header["n_tokens"])
            version, saved_vocab = header["version"], int(header["n_vocab"])
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # OverflowError: a count of 1e999
            raise MemoryFileError(f"{path}: the drafting memory's header is damaged; delete the file") from None
        if version != VERSION:
            raise MemoryFileError(f"{path}: drafting memory version {version}, this specllm reads {VERSION}; delete "
                                  "the file (the memory is rebuilt as it generates)")
        if n_vocab is not None and saved_vocab != n_vocab:
            raise MemoryFileError(f"{path} was saved by an LLM whose vocabulary has {saved_vocab} tokens "
                                  f"({header.get('model')}), this one has {n_vocab}: a memory only fits its model "
                                  "family; give this model a file of its own (or delete this one)")
        if vocab is not None and header.get("vocab") not in (None, vocab):
            raise MemoryFileError(f"{path} was saved by an LLM whose vocabulary has other tokens than this one's "
                                  f"({header.get('model')}; the same size, {saved_vocab}): a memory only fits its "
                                  "model family; give this model a file of its own (or delete this one)")
        start = f.tell()
        size = os.fstat(f.fileno()).st_size - start
        if n < 0 or size != 4 * n:
            raise MemoryFileError(f"{path}: the drafting memory is truncated ({size} bytes of tokens, the header "
                                  f"says {4 * n}); delete the file")
        skip = 0 if keep is None else max(0, n - keep - 1)
        f.seek(start + 4 * skip)
        body = f.read(4 * (n - skip))
    if len(body) != 4 * (n - skip):  # cut while it was read
        raise MemoryFileError(f"{path}: the drafting memory was cut short while it was read; save it again")
    tokens = np.frombuffer(body, dtype="<i4")
    if len(tokens) and (tokens.min() < -1 or tokens.max() >= (saved_vocab if n_vocab is None else n_vocab)):
        raise MemoryFileError(f"{path}: the drafting memory holds token ids outside the vocabulary; delete the file")
    return tokens.tolist()


def _check_place(path: str, what: str) -> None:
    """files.check_file_path's refusal as a MemoryFileError (a memory written there replaced notes.txt)."""
    try:
        files.check_file_path(path)
    except OSError as e:
        raise MemoryFileError(f"{what} {path}: {e.strerror}; give the path of a file") from None


class MemoryFile:
    """LLM(memory_file=PATH): the drafting memory kept in a file across processes. Read at load (a file that is not
    a drafting memory, or one of another vocabulary, is an error and is never overwritten); written, atomically,
    after every generation and after reset / clear_memory / load_memory, so a process that dies loses at most the
    generation it was running. A write that fails after a generation is logged, not raised: the reply stands."""

    def __init__(self, path: str):
        if not path.strip():
            raise MemoryFileError("memory_file is empty: give a file's path, or None for no file")
        self.path = path
        _check_place(path, "memory_file")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise MemoryFileError(f"memory_file {path}: the directory {parent} does not exist; create it or give "
                                  "another path")
        if os.path.isdir(path):
            raise MemoryFileError(f"memory_file {path} is a directory; give the path of a file")
        if os.path.exists(path) and not os.path.isfile(path):  # a FIFO hung the load, a device would be overwritten
            raise MemoryFileError(f"memory_file {path} is not a regular file; give the path of a file")
        if not os.path.exists(path) and not os.access(parent, os.W_OK):  # said before a server binds, not after
            # the models loaded (and a first run's minute of cost measurement); the load's write says it for root
            raise MemoryFileError(f"memory_file {path} cannot be written: the directory {parent} is not writable")
        self._failing = False
        self.read(None, keep=0)  # a file that is not a drafting memory fails now, before the models load

    def read(self, n_vocab: Optional[int], keep: Optional[int] = None, vocab: Optional[str] = None) -> List[int]:
        """The saved memory (its newest keep + 1 tokens at most), or [] when the file does not exist yet."""
        if not os.path.exists(self.path):
            return []
        try:
            return load(self.path, n_vocab, keep, vocab)
        except OSError as e:
            raise MemoryFileError(f"memory_file {self.path} cannot be read: {e.strerror or e}") from None
        except MemoryFileError as e:
            raise MemoryFileError(f"memory_file: {e}") from None

    def create(self, n_vocab: int, model: str, vocab: str) -> None:
        """Write an empty memory where there is no file yet: a place that cannot be written fails now, at load."""
        try:
            save(self.path, [], n_vocab, model, vocab)
        except OSError as e:
            raise MemoryFileError(f"memory_file {self.path} cannot be written: {e.strerror or e}") from None

    def write(self, tokens: List[int], n_vocab: int, model: str, vocab: str) -> None:
        try:
            save(self.path, tokens, n_vocab, model, vocab)
        except OSError as e:
            if not self._failing:  # once until a write succeeds again, not after every reply
                log.warning("the drafting memory could not be saved to %s: %s (the reply is not affected; tried "
                            "again after the next generation)", self.path, e.strerror or e)
            self._failing = True
            return
        if self._failing:
            log.warning("the drafting memory is saved to %s again", self.path)
        self._failing = False


class MemoryMethods:
    """LLM's methods over its drafting memory (earlier outputs the n-gram drafter looks up)."""

    def clear_memory(self) -> None:
        """Forget earlier outputs and what "auto" learned about drafting from them (the KV cache stays)."""
        with Call(self._gate):
            self._engine.clear_memory()
            self._memory_changed()

    def save_memory(self, path: Union[str, os.PathLike]) -> None:
        """Write the drafting memory to a file (atomically), for load_memory in another process; OSError (naming
        path) where it cannot be written."""
        path = _path("path", os.fspath(path))
        with Call(self._gate):
            tokens = self._engine.memory()
        save(path, tokens, self._engine.target.n_vocab, self.model_path, self._vocab_hash())  # OSError names path

    def load_memory(self, path: Union[str, os.PathLike]) -> None:
        """Replace the drafting memory with one saved by save_memory (an LLM of the same model family); a memory
        larger than memory_tokens keeps its newest outputs; what "auto" learned about the memory it replaces starts
        over. Raises MemoryFileError for a file that is not one (a FIFO or a directory too), is damaged, or fits
        another vocabulary; OSError (FileNotFoundError...) for one that cannot be read."""
        path = _path("path", os.fspath(path))
        tokens = load(path, self._engine.target.n_vocab, self._engine.memory_tokens, self._vocab_hash())
        with Call(self._gate):
            self._engine.set_memory(tokens)
            self._memory_changed()

    def _memory_changed(self) -> None:  # under the gate
        if self._memory_file is not None:
            self._memory_file.write(self._engine.memory(), self._engine.target.n_vocab, self.model_path,
                                    self._vocab_hash())

    def _vocab_hash(self) -> str:
        """The target's vocab_hash, computed once (a pass over its tokens: ~10 ms for 152k)."""
        if getattr(self, "_vocab_digest", None) is None:
            self._vocab_digest = self._engine.target.vocab_hash
        return self._vocab_digest

    @property
    def memory_size(self) -> int:
        """Tokens in the drafting memory now (outputs and the separators between them)."""
        return len(self._engine.memory())
