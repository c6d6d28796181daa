"""The drafting memory on disk: earlier generations' outputs (token ids, -1 between outputs), so that a new process
drafts from what an earlier one wrote.

File layout: a magic line, a JSON header line ({"version", "n_vocab", "model", "n_tokens"}), then n_tokens int32
little-endian ids. Written to a temporary file and renamed, so a crash never leaves half a file."""
from __future__ import annotations

import json
import os
from typing import List

import numpy as np

from .errors import MemoryFileError

MAGIC = b"SPECLLM-DRAFTING-MEMORY\n"
VERSION = 1


def save(path: str, tokens: List[int], n_vocab: int, model: str) -> None:
    header = json.dumps({"version": VERSION, "n_vocab": n_vocab, "model": os.path.basename(model),
                         "n_tokens": len(tokens)}).encode() + b"\n"
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(header)
            f.write(np.asarray(tokens, dtype="<i4").tobytes())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load(path: str, n_vocab: int) -> List[int]:
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise MemoryFileError(f"{path} is not a specllm drafting memory (save one with LLM.save_memory)")
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC):end])
        n = int(header["n_tokens"])
        version, saved_vocab = header["version"], int(header["n_vocab"])
    except (ValueError, KeyError, TypeError):
        raise MemoryFileError(f"{path}: the drafting memory's header is damaged; delete the file") from None
    if version != VERSION:
        raise MemoryFileError(f"{path}: drafting memory version {version}, this specllm reads {VERSION}")
    if saved_vocab != n_vocab:
        raise MemoryFileError(f"{path} was saved by an LLM whose vocabulary has {saved_vocab} tokens "
                              f"({header.get('model')}), this one has {n_vocab}: a memory only fits its model family")
    body = data[end + 1:]
    if end < 0 or len(body) != 4 * n:
        raise MemoryFileError(f"{path}: the drafting memory is truncated ({len(body)} bytes of tokens, the header "
                              f"says {4 * n}); delete the file")
    tokens = np.frombuffer(body, dtype="<i4")
    if n and (tokens.min() < -1 or tokens.max() >= n_vocab):
        raise MemoryFileError(f"{path}: the drafting memory holds token ids outside the vocabulary; delete the file")
    return tokens.tolist()
