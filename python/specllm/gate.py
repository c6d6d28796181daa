"""The gate that lets one generation of an LLM run at a time.

The gate admits one holder at a time; a holder is a stream (through its _Ticket) or a Call such as reset(). A
caller that waits behind an open stream which nobody advances (no next() running) for `idle_timeout` seconds
closes that stream and goes ahead, so an abandoned stream never blocks the LLM for longer than that; the abandoned
stream then ends with finish_reason "cancelled". Ctrl-C never leaves the gate held: its bookkeeping defers SIGINT,
and a leave cut off by one is done again.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Optional

from . import compute_threads
from .errors import SpecLLMError

if TYPE_CHECKING:
    from .stream import Stream

log = logging.getLogger("specllm")

@contextlib.contextmanager
def _interrupts_deferred():
    """Ctrl-C inside the block (main thread) takes effect when it ends: the gate's short bookkeeping (who holds it)
    is never left half done. Interrupted there, the gate stayed held by a holder gone, and every later call of the
    LLM waited for ever (a reviewer's rapid SIGINTs: after some hundreds)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit = []
    try:
        previous = signal.signal(signal.SIGINT, lambda *a: hit.append(a))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if hit:
        if callable(previous):
            previous(*hit[0])
        elif previous == signal.SIG_DFL:  # the default action (the process ends), as without the block
            os.kill(os.getpid(), signal.SIGINT)
        elif previous != signal.SIG_IGN:  # a handler set from C (None): Python's own
            raise KeyboardInterrupt


def _through_interrupts(fn: Callable, *args) -> None:
    """fn(*args), again if Ctrl-C cut it off (a signal's handler runs even as a function is entered: at the entry of
    Gate.leave it left the gate held), the interrupt raised once it is done."""
    interrupted = None
    for _ in range(100):
        try:
            fn(*args)
            break
        except KeyboardInterrupt as e:
            interrupted = e
    if interrupted is not None:
        raise interrupted


class _Abandoned(Exception):
    """Gate.enter's caller gave up waiting (a queued stream was cancelled)."""


class Gate:
    def __init__(self, idle_timeout: float):
        self.idle_timeout = idle_timeout
        self._pid = os.getpid()  # of the process that loaded the LLM
        self._cond = threading.Condition()
        self._holder = None  # a stream's _Ticket, or a Call
        self._queue = collections.deque()  # waiters in arrival order: the gate goes to the first
        self._shut = False   # the interpreter is exiting (shut())
        self._here = self._pid  # the process _cond and _holder are of

    def _forked(self) -> None:
        """In a process forked from the one that used the gate: its holder (a parent's thread inside an embedding, a
        stream's step) and whoever held the condition's lock at the fork are not here, and would never leave (the
        child's close() waited for ever, its exit 10 s): the gate starts free."""
        if os.getpid() != self._here:
            self._cond, self._holder, self._here = threading.Condition(), None, os.getpid()
            self._queue = collections.deque()

    def enter(self, holder, abandon: Optional[Callable[[], bool]] = None) -> None:
        """Wait until holder may run (preempting a stream left idle for idle_timeout); _Abandoned once abandon()
        says so (checked whenever the gate changes hands and on wake())."""
        if os.getpid() != self._pid and not getattr(holder, "closing", False):
            raise SpecLLMError("this LLM was loaded in another process (this one was forked from it: os.fork, "
                               "multiprocessing's 'fork' start method), where llama.cpp's threads are not; it hung "
                               "here. Load the LLM in this process, or use multiprocessing's 'spawn' start method")
        self._forked()
        with self._cond:
            self._check_shut()
            if self._holder is holder:  # taken by an earlier enter that Ctrl-C cut off before its caller knew
                return
            # in arrival order: a thread that embeds or generates in a loop took the gate back before the thread
            # waiting for it woke (a chat waited 30+ s behind an indexer's 11,674 embeddings)
            self._queue.append(holder)
            try:
                while self._holder is not None or self._queue[0] is not holder:
                    if abandon is not None and abandon():
                        raise _Abandoned
                    h = self._holder
                    idle = None if h is None else h._idle_since
                    if idle is None:  # held and busy, or free for a waiter ahead of this one
                        self._cond.wait()
                        continue
                    left = idle + self.idle_timeout - time.monotonic()
                    if left > 0:
                        self._cond.wait(min(left, 86400.0))  # an infinite idle_timeout never preempts
                        continue
                    h._preempt()  # idle: nobody is inside its next(), so the engine is free to touch
                    self._holder = None
                    self._cond.notify_all()  # the first waiter takes it
                self._check_shut()  # shut while this waited
                self._holder = holder
            finally:
                self._queue.remove(holder)
                self._cond.notify_all()  # the next waiter is first now

    def wake(self) -> None:
        """Have waiters look again (a queued stream was cancelled: it gives up at once)."""
        self._forked()
        with self._cond:
            self._cond.notify_all()

    @property
    def exiting(self) -> bool:
        """shut() was called: a call holding the gate (an embedding) should end at its next chance."""
        return self._shut

    def _check_shut(self) -> None:
        if self._shut and threading.current_thread() is not threading.main_thread():
            raise SpecLLMError("the interpreter is exiting: this LLM takes no more calls from other threads")

    def shut(self, timeout: float) -> bool:
        """At interpreter exit: cancel the running stream, refuse later calls from other threads, and wait (up to
        timeout seconds) until no thread is inside llama.cpp for this LLM. A daemon thread that comes back from C++
        while Python finalizes is ended by Python in a way C++ cannot unwind, which aborted the process. True when
        the holder left (or is an idle stream, which runs nothing)."""
        self._forked()
        with self._cond:
            self._shut = True
            h = self._holder
            stream = h.stream() if isinstance(h, _Ticket) else None
        if stream is not None:
            stream.cancel()
        with self._cond:
            left = self._cond.wait_for(lambda: self._holder is None or self._holder._idle_since is not None, timeout)
            if left and self._holder is not None:  # a stream between two chunks: ended here, so that its thread's
                self._holder._preempt("exit")       # next next() finds it ended and does not enter the engine
                self._holder = None
                self._cond.notify_all()
            return left

    def end_idle_stream(self, why: str) -> None:
        """End the holder at once if it is a stream between two chunks (nobody inside its next()); a stream running
        a step, or a call, is left to finish."""
        self._forked()
        with self._cond:
            h = self._holder
            if isinstance(h, _Ticket) and h._idle_since is not None:
                h._preempt(why)
                self._holder = None
                self._cond.notify_all()

    def idle(self, holder) -> None:
        self._forked()
        with _interrupts_deferred(), self._cond:
            holder._idle_since = time.monotonic()
            self._cond.notify_all()

    def busy(self, holder) -> bool:
        """Mark holder as running a step; False if it was preempted meanwhile."""
        self._forked()
        with _interrupts_deferred(), self._cond:
            if self._holder is not holder:
                return False
            holder._idle_since = None
            return True

    def holds(self, holder) -> bool:
        return self._holder is holder

    def leave(self, holder) -> None:
        self._forked()
        with _interrupts_deferred(), self._cond:
            if self._holder is holder:
                self._holder = None
                self._cond.notify_all()
        # this thread is done decoding for now: its pool of CPU workers goes (threads.h). Left alive, a second
        # thread's decodes (a server's worker, a measurement on a thread of its own) all ran ~20% slower on 2 cores
        compute_threads.release()


class _Ticket:
    """A stream's place in the gate. The gate holds the ticket, not the stream, so that a stream nobody
    references any more is collected (and closes itself) even while it holds the gate."""
    __slots__ = ("stream", "_idle_since")

    def __init__(self, stream: "Stream"):
        self.stream = weakref.ref(stream)
        self._idle_since: Optional[float] = None

    def _preempt(self, why: str = "idle") -> None:
        stream = self.stream()
        if stream is not None:
            stream._preempt(why)


class Call:
    """A gate holder for a call that does not stream (reset, set_draft): never idle while it holds the gate."""
    _idle_since = None

    def __init__(self, gate: Gate, closing: bool = False):
        self._gate = gate
        self.closing = closing  # close(): let in a forked process too (it frees what the process inherited)

    def __enter__(self):
        try:
            self._gate.enter(self)
        except BaseException:  # Ctrl-C as enter took the gate: given back (leave does nothing if it did not)
            _through_interrupts(self._gate.leave, self)
            raise
        return self

    def __exit__(self, *exc):
        _through_interrupts(self._gate.leave, self)

    def _preempt(self) -> None:  # pragma: no cover - never idle
        raise AssertionError("a call is never idle")
