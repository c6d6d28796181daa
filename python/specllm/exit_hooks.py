"""What an interpreter's exit waits for: a generation a daemon thread still runs (each LLM's at_exit, registered
by LLM()), the prompt states still being written, and every call into llama.cpp made without the GIL
(_wait_for_native_calls, registered at import, so that atexit runs it after the LLMs' hooks)."""
from __future__ import annotations

import atexit
import threading
import time

from . import _core, costs, logs


def at_exit(ref, flush: bool) -> None:
    """At interpreter exit: a generation a daemon thread still runs is cancelled and waited for (10 s at most), so
    that Python does not finalize while that thread is inside llama.cpp (Gate.shut); then (flush: a prompt_cache_dir)
    the prompt states still being written reach the disk (close() waits for them too)."""
    costs.exiting()  # a measurement another thread runs (measure_costs, holding the gate) ends at once
    _core.set_exiting(threading.main_thread().ident)  # other threads' later calls into llama.cpp are refused
    llm = ref()
    if llm is not None and not llm.closed:
        llm._gate.shut(timeout=10.0)  # an embedding ends within a batch, a stream within a step
        if flush:
            llm._engine.flush_prompt_store()
    if flush:  # the writer's note of a failed write (a full disk): generate's only state is written at the end, and
        logs.drain()  # an LLM dropped without close() (freed by a GC pass before now) wrote it as it was freed


def _wait_for_native_calls(timeout: float = 10.0) -> None:
    """At interpreter exit, after each LLM's at_exit: wait (10 s at most) until no thread is inside a call into
    llama.cpp made without the GIL. The gate covers a generation, not the calls outside it (tokenizing a prompt
    before the next generate(), memory_size, close() or dropping an LLM): a daemon thread that came back from one
    while Python finalized aborted the process ("terminate called without an active exception")."""
    _core.set_exiting(threading.main_thread().ident)  # no new ones from other threads (a loop's next call)
    end = time.monotonic() + timeout
    while _core.native_calls_inside() > 0 and time.monotonic() < end:
        time.sleep(0.005)


atexit.register(_wait_for_native_calls)  # at import: atexit runs it after the hooks of LLMs loaded since
