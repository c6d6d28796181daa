"""The calling thread's pool of CPU backend workers, released when the thread is done decoding for now
(cpp/include/specllm/threads.h: two pools alive on a machine with no more cores than one uses slow every decode)."""
from __future__ import annotations

import os
import threading

from . import _core

# (process, thread) of the copy a fork made of the thread that forked: the workers of the pool it may hold were not
# copied, and releasing it waits for them for ever (libgomp; a child killed by its alarm after 5 s)
_forked_copy = None


def _after_fork_in_child() -> None:
    global _forked_copy
    _forked_copy = (os.getpid(), threading.get_ident())


os.register_at_fork(after_in_child=_after_fork_in_child)


def release() -> None:
    """Release this thread's pool (none held, no OpenMP: nothing happens); never call it inside a decode."""
    if _forked_copy == (os.getpid(), threading.get_ident()):
        return
    _core.release_compute_threads()
