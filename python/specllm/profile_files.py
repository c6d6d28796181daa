"""Where the cost profiles live: one JSON file per model pair, device, thread count and kernels
(SPECLLM_PROFILES, default ~/.cache/specllm/profiles), written whole or not at all, and the lock that lets one load
at a time on this machine measure costs. profile.py measures the costs and judges them; this file only keeps them."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
from pathlib import Path

from . import _core, amx, files
from .errors import Cancelled

log = logging.getLogger("specllm.profile")  # profile.py's log: specllm-cli shows it on stderr


def cache_dir() -> Path:
    # an empty SPECLLM_PROFILES is unset (Path("") is the current directory), as SPECLLM_CACHE is
    return Path(os.environ.get("SPECLLM_PROFILES") or Path.home() / ".cache" / "specllm" / "profiles")


def kernel_key(opts) -> object:
    """What, beside threads and layers, sets the target's kernels and so its costs (a ModelOptions): weight repacking
    (and, where llama.cpp offers AMX, whether the repacked weights are AMX's: specllm/amx.py), and the KV cache's
    types and flash attention when not the defaults (so the defaults' profiles keep their keys)."""
    repack = bool(opts.repack)
    if repack and amx.left_out():
        repack = "True|amx=off"  # not a key an AMX-off profile had before 2026-12-06 (no repacking then: False)
    if (opts.cache_type_k, opts.cache_type_v, opts.flash_attn) == ("f16", "f16", -1):
        return repack
    return f"{repack}|kv={opts.cache_type_k}/{opts.cache_type_v}|fa={opts.flash_attn}"


def key(target: str, draft: str, n_threads: int, n_gpu_layers: int, kernels, verify_rows: int) -> str:
    # verify_rows: exact mode (chunks of 3 rows) and fast mode load the same weights but measure other sizes
    parts = [platform.machine(), platform.node(), _core.llama_cpp_version, str(n_threads), str(n_gpu_layers),
             str(kernels), str(verify_rows)]
    for path in (target, draft):
        if path:
            st = os.stat(path)
            parts += [os.path.abspath(path), str(st.st_size), str(int(st.st_mtime))]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def path(target: str, draft: str, n_threads: int, n_gpu_layers: int, kernels, verify_rows: int) -> Path:
    return cache_dir() / f"{key(target, draft, n_threads, n_gpu_layers, kernels, verify_rows)}.json"


def write(where: Path, prof: dict) -> None:
    """Writes prof to where whole or not at all (a temporary file renamed over it)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(where, json.dumps(prof).encode())


LOCK_WAIT_S = 300  # the longest a load waits for another process measuring costs, then measures too
MEASURING_LOCK = "measuring.lock"  # in the profile directory: held while a process measures


@contextlib.contextmanager
def measuring(engine, target: str):
    """One load at a time measures costs on this machine: two measuring at once (two servers started together, a chat
    beside a server's first load, two LLMs of one process, whatever their models or thread counts) each time the
    other's work and both keep a busy profile (an flock: each open of the lock file is its own holder, threads too). Within it this process holds the profile directory's lock; Cancelled when the engine is
    interrupted while it waits (a stopped load, Ctrl-C); after LOCK_WAIT_S it measures too, as before."""
    def waiting() -> None:
        log.info("another load (in this process or another) is measuring verify costs on this machine: waiting "
                 "for it (up to %d s) before measuring those of %s (or taking its profile, if it measures the same)",
                 LOCK_WAIT_S, os.path.basename(target))

    def stopped() -> bool:
        if engine.interrupted:
            raise Cancelled("the load was stopped while it waited for another process's cost measurement")
        return False

    directory = cache_dir()
    with contextlib.suppress(OSError):  # a directory that cannot be made: no lock (the write says what to do)
        directory.mkdir(parents=True, exist_ok=True)
    with files.exclusive(directory / MEASURING_LOCK, LOCK_WAIT_S, waiting, stopped) as held:
        if held is None:
            log.warning("another load has measured costs on this machine for %d s; measuring here too", LOCK_WAIT_S)
        yield
