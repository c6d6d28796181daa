"""The cost profile an LLM drafts by: taken from the cache (or measured) when a drafter is set, judged after each
generation (profile.mark_if_stale), and measured again on request (LLM.measure_costs). profile.py measures and
judges it, profile_files.py keeps the files; Costs is the LLM's part: which profile is in use, whether its steps
judged it stale, and the measurement another thread may interrupt."""
from __future__ import annotations

import atexit
import contextlib
import os
import threading
from typing import Optional

from . import compute_threads, logs, profile, profile_files
from .errors import Cancelled


_loading = threading.local()  # .stop: the Event that ends the loads on this thread (stoppable_load)

# At interpreter exit, measurements other threads run (an LLM loading in a daemon thread, measure_costs) are
# interrupted and waited for: a thread that came back from llama.cpp while Python finalized died with SIGSEGV.
_exiting = threading.Event()
_measuring = threading.Condition()
_n_measuring = 0


def exiting() -> None:
    """The interpreter exits: running measurements end within one timed step (LLM's exit hook calls it first)."""
    _exiting.set()


@atexit.register  # at import, so after every LLM's own exit hook (LIFO): a measurement's LLM may not exist yet
def _at_exit() -> None:
    _exiting.set()
    with _measuring:
        _measuring.wait_for(lambda: _n_measuring == 0, timeout=10.0)


def _forked() -> None:
    """In a forked child: the parent's threads (and their loads) are not here; its exit must not wait for them."""
    global _measuring, _n_measuring
    _measuring, _n_measuring = threading.Condition(), 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


@contextlib.contextmanager
def exit_waits():
    """The interpreter's exit waits (10 s at most) until the block ends: an LLM's load, a measurement."""
    global _n_measuring
    with _measuring:
        _n_measuring += 1
    try:
        yield
    finally:
        with _measuring:
            _n_measuring -= 1
            _measuring.notify_all()


@contextlib.contextmanager
def stoppable_load(stop: threading.Event):
    """LLMs made on this thread meanwhile end the cost measurement of their load within one timed step once `stop`
    is set (from any thread; before the measurement, it is not begun): LLM(...) raises Cancelled. A server's worker
    loads its model so, and stopping the server sets it (the minute's measurement held the process at exit, which
    then died in llama.cpp)."""
    outer, _loading.stop = getattr(_loading, "stop", None), stop
    try:
        yield
    finally:
        _loading.stop = outer


class Costs:
    def __init__(self, engine, opts, model_path: str, enabled: bool):
        self.engine = engine
        self._opts = opts  # the LLM's load options (set_draft changes their drafter in place)
        self._model_path = model_path
        self._enabled = enabled  # LLM(profile_costs=...)
        self.profile: Optional[dict] = None  # the cost profile of the current drafter (None without one)
        self.known: Optional[dict] = None  # the target's verify costs, kept across set_draft
        self.stale_checked = False  # the drafter's profile was judged stale (profile.STALE_LEVEL): not judged again
        self.steps_before = 0  # steps that taught the policy's level before the drafter was set
        self._lock = threading.Lock()  # guards measuring: stop() interrupts only a measurement
        self.measuring = False

    def _args(self) -> tuple:
        o = self._opts.target
        return o.n_threads, o.n_gpu_layers, profile_files.kernel_key(o), self._opts.verify_rows

    def drafter_loaded(self, draft_path: Optional[str], has_drafter: bool, swapped: bool) -> None:
        """A drafter was set (at load, or swapped in under a live KV cache): its profile from the cache, or measured."""
        self.profile = None
        if self._enabled and has_drafter:
            args = self._args()
            # the target's verify costs from an earlier profile (of this LLM, or cached for this target with the
            # n-gram drafter): measuring them again would clear the target's KV cache. A busy profile is measured
            # again at a load only: after a swap it is taken as it is (the conversation's cache stays)
            known = self.known or profile.cached(self._model_path, "", *args, busy_ok=swapped)
            self.profile = self._interruptible(lambda: profile.load_or_measure(
                self.engine, self._model_path, draft_path or "", *args, known=known, swapped=swapped))
            self.known = self.profile
            logs.drain()
        # a profile judged stale (or taken from one) is not judged again; another drafter's own profile is, by the
        # steps run with it (the level so far was learned against the costs before)
        self.stale_checked = self.profile is not None and "stale" in self.profile
        self.steps_before = self.engine.step_level()[1]

    def _interruptible(self, fn):
        """fn() (a profile read or measured), on a thread of its own when called from the main thread: a C++ call
        holds Python's signal handlers, so a Ctrl-C during the minute a measurement takes at a load waited for its
        end. Now the measurement is interrupted within one timed step and KeyboardInterrupt raised at once (the
        partial measurement is not kept). On any thread, a stoppable_load's stop ends it so too (Cancelled)."""
        stop = getattr(_loading, "stop", None)
        if stop is not None and stop.is_set():
            raise Cancelled("the load was stopped before its cost measurement")
        on_main = threading.current_thread() is threading.main_thread()  # (an exit hook may still load an LLM)
        if _exiting.is_set() and not on_main:  # a load in another thread reached its measurement at exit
            raise Cancelled("the interpreter is exiting: the cost measurement was not begun")
        if not on_main:
            with exit_waits(), self._stopped_by(stop, "specllm-load-stop"):
                return fn()
        box, done = {}, threading.Event()

        def run():
            try:
                box["value"] = fn()
            except BaseException as e:  # raised in the caller's thread
                box["error"] = e
            finally:
                done.set()

        thread = threading.Thread(target=run, name="specllm-measure-load")
        # the measurement is the only thread decoding: the pool of CPU workers this one may hold (it generated
        # with another LLM, a llama-cpp-python model ran here) goes first, or every barrier of the measured decodes
        # slept (threads.h): on a 2-core EPYC T(1) read 31 ms instead of 26, T(2) / T(1) 1.46 instead of 1.7-1.9
        compute_threads.release()
        try:
            thread.start()
            while not done.wait(0.1):  # an Event's wait, not a join: a join cut by Ctrl-C left the thread half-ended
                if stop is not None and stop.is_set():
                    self.engine.interrupt()
        except BaseException:  # Ctrl-C, or a signal handler's SystemExit: the measurement ends within one step
            if thread.ident is not None:  # started
                self.engine.interrupt()
                while not done.is_set():  # not left inside llama.cpp as the interpreter exits
                    try:
                        done.wait()
                    except BaseException:
                        pass
            raise
        finally:
            self.engine.clear_interrupt()  # an interrupt the measurement did not meet is not left for a generation
        if "error" in box:
            raise box["error"]
        return box["value"]

    @contextlib.contextmanager
    def _stopped_by(self, stop: Optional[threading.Event], name: str):
        """Within it, the engine is interrupted once `stop` is set or the interpreter exits (a measurement ends
        within one timed step, Cancelled); after it, no interrupt is left for a generation."""
        over = threading.Event()
        exit_stops = threading.current_thread() is not threading.main_thread()  # an exit hook may measure
        threading.Thread(target=self._watch, args=(stop, over, exit_stops), name=name, daemon=True).start()
        try:
            yield
        finally:
            with self._lock:
                self.measuring = False
                self.engine.clear_interrupt()
                over.set()

    def check(self, draft_path: Optional[str]) -> None:
        """After a generation: a cost profile the steps have run far below is marked, to be measured again at the
        next load (or by measure())."""
        if self.profile is not None and not self.stale_checked:
            judged = profile.mark_if_stale(self.engine, self.profile, self._model_path, [draft_path or "", ""],
                                           *self._args(), self.steps_before)
            if judged is not None:  # a drafter set later takes these verify costs with the mark (load_or_measure)
                self.stale_checked = True
                self.known = judged

    @property
    def stale(self) -> bool:
        return self.profile is not None and "stale" in (self.known or {})

    def measure(self, draft_path: Optional[str], stop: Optional[threading.Event] = None) -> bool:
        """LLM.measure_costs (the caller holds the LLM's gate). stop: set from any thread, before the measurement
        begins or during it, it ends this measurement (within one timed step) and no other."""
        if self.profile is None:  # no drafter, or profile_costs=False
            return False
        with self._lock:  # a stop set before this point is seen here; one set after it, by the watcher
            if stop is not None and stop.is_set():
                return False
            self.measuring = True
        try:
            with exit_waits(), self._stopped_by(stop, "specllm-measure-stop"):
                prof = profile.load_or_measure(self.engine, self._model_path, draft_path or "", *self._args(),
                                               measure=True)
        except Cancelled:
            profile.log.info("measuring the cost profile again was interrupted; the costs stay as they were")
            return False
        finally:
            logs.drain()
        self.profile = self.known = prof
        self.stale_checked = False
        self.steps_before = self.engine.step_level()[1]  # 0: the levels start again (new costs)
        return True

    def stop(self) -> None:
        """LLM.stop_measuring: from any thread."""
        with self._lock:
            if self.measuring:
                self.engine.interrupt()

    def _watch(self, stop: Optional[threading.Event], over: threading.Event, exit_stops: bool) -> None:
        """Interrupts the measurement once `stop` is set, or the interpreter exits, unless it is over first (polled:
        an Event cannot wait for either of two)."""
        while not over.wait(0.02):
            if (stop is not None and stop.is_set()) or (exit_stops and _exiting.is_set()):
                with self._lock:
                    if not over.is_set():
                        self.engine.interrupt()
                return
