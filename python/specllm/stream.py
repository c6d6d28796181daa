"""Streams: an LLM's generation as an iterator of Chunks.

A Stream belongs to its LLM, not to a thread: any thread may advance it, and any thread may cancel() it (a server
cancels from its event loop while a worker thread consumes). It holds the LLM's gate (gate.py) while it runs.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, List, Optional

from . import logs
from .errors import Cancelled
from .gate import Gate, _Abandoned, _through_interrupts, _Ticket
from .results import Chunk, Stats, TokenLogprob

log = logging.getLogger("specllm")


class Stream:
    """An iterator of Chunks, one per speculative step; the last one carries finish_reason and stats.

    cancel() may be called from any thread: the generation stops within one step (one prompt batch during
    prompt processing) and the stream ends with a chunk whose finish_reason is "cancelled". close() (or
    leaving a `with` block, or dropping the stream) ends it early and frees the LLM; the KV cache stays
    consistent either way."""

    def __init__(self, llm, tokens: List[int], opts, on_finish: Callable[[Stats], None]):
        self._llm = llm
        self._engine = None  # the LLM's engine, taken once the gate admits the stream (the LLM may be closed)
        self._gate: Gate = llm._gate
        self._tokens = tokens
        self._opts = opts
        self._on_finish = on_finish
        self._lock = threading.Lock()        # one next()/close() at a time
        self._state = threading.Lock()       # guards _cancelled / _running between cancel() and the runner
        self._cancelled = False
        self._running = False                # the engine runs this stream's generation
        self._entered = False
        self._done = False
        self._preempted_stats: Optional[Stats] = None
        self._start_failed = False           # engine.start raised (the prompt did not fit, ...)
        self._ticket = _Ticket(self)
        self.stats: Optional[Stats] = None   # set when the stream ends
        self.finish_reason: Optional[str] = None
        # prompt_logprobs=n: one entry per prompt token (the first None), set once the prompt is processed; the
        # first chunk carries them too
        self.prompt_logprobs: Optional[List[Optional[TokenLogprob]]] = None
        self._unsent_prompt_logprobs = False

    def __iter__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Ask the generation to stop (thread-safe, returns at once)."""
        with self._state:
            self._cancelled = True
            if self._running:
                self._engine.interrupt()
        if not self._entered:  # a next() waiting for the LLM behind another call gives up now (it waited for it)
            self._gate.wake()

    def close(self) -> None:
        """End the stream now (from any thread); a step running elsewhere finishes first."""
        self.cancel()
        with self._lock:
            if not self._done:
                self._end(cancelled=True)

    def __next__(self) -> Chunk:
        with self._lock:
            if self._done:
                raise StopIteration
            if not self._entered:
                try:
                    self._gate.enter(self._ticket, abandon=lambda: self._cancelled)
                except _Abandoned:  # cancelled (or closed) while it waited: nothing of it ran
                    self._done = True
                    return self._last_chunk("cancelled", Stats())
                except BaseException:  # Ctrl-C as enter took the gate: given back
                    _through_interrupts(self._gate.leave, self._ticket)
                    raise
                self._entered = True  # (an interrupt here is caught by _end's holds(): see below)
                self._engine = self._llm._engine
            elif not self._gate.busy(self._ticket):  # preempted while idle
                self._done = True
                return self._last_chunk("cancelled", self._preempted_stats or Stats())
            try:
                chunk = self._advance()
            except BaseException:
                self._end(cancelled=True)
                raise
            if self._unsent_prompt_logprobs:
                chunk.prompt_logprobs, self._unsent_prompt_logprobs = self.prompt_logprobs, False
            if chunk.finish_reason is not None:
                self._end(cancelled=False)
            else:
                self._gate.idle(self._ticket)
            return chunk

    def _advance(self) -> Chunk:
        engine = self._engine
        if self._cancelled:
            return self._last_chunk("cancelled", Stats.from_core(engine.stats) if self._running else Stats())
        if not self._running:
            with self._state:
                self._running = True
                if self._cancelled:
                    engine.interrupt()
            try:
                engine.start(self._tokens, self._opts)
            except Cancelled:
                return self._last_chunk("cancelled", Stats.from_core(engine.stats))
            except BaseException:
                self._start_failed = True  # nothing of this call ran: no stats of its own, no finish hooks
                raise
            finally:
                logs.drain()
            if self._opts.prompt_logprobs >= 0:
                self.prompt_logprobs = [None] + TokenLogprob.from_core(engine.prompt_logprobs)
                self._unsent_prompt_logprobs = True
        r = engine.step()
        if r.done:
            return self._last_chunk(r.finish_reason, Stats.from_core(engine.stats), r)
        return Chunk(r.text, list(r.tokens), r.n_drafted, r.n_accepted, logprobs=self._logprobs(r))

    def _logprobs(self, r=None):
        if self._opts.logprobs < 0:
            return None
        return TokenLogprob.from_core(r.logprobs) if r is not None else []

    def _last_chunk(self, reason: str, stats: Stats, r=None) -> Chunk:
        self.finish_reason, self.stats = reason, stats
        if r is None:
            return Chunk("", [], 0, 0, reason, stats, self._logprobs())
        return Chunk(r.text, list(r.tokens), r.n_drafted, r.n_accepted, reason, stats, self._logprobs(r))

    def _preempt(self, why: str = "idle") -> None:
        """Called by the gate (under its lock) when a waiter takes over an idle stream, or at exit."""
        self._cancelled = True
        self._preempted_stats = self._finish_engine()
        self.finish_reason, self.stats = "cancelled", self._preempted_stats or Stats()  # ended, if not yet told
        if why == "idle":
            log.warning("an open stream sat idle for %.0f s while another call waited: it was closed",
                        self._gate.idle_timeout)

    def _finish_engine(self) -> Optional[Stats]:
        with self._state:
            was_running, self._running = self._running, False
        engine, self._engine = self._engine, None  # an ended stream keeps no engine: LLM.close() frees the models
        if not was_running:
            return None
        if engine.active:
            engine.cancel()  # closed early or interrupted: the KV cache stays consistent
        engine.clear_interrupt()
        if self._start_failed:  # the engine's stats are still the previous call's
            return None
        stats = Stats.from_core(engine.stats)
        self._on_finish(stats)
        logs.drain()
        return stats

    def _end(self, cancelled: bool) -> None:
        self._done = True
        _through_interrupts(self._end_once, cancelled)  # again if Ctrl-C cut it off (busy() entered, the gate held)

    def _end_once(self, cancelled: bool) -> None:
        if self._entered or self._gate.holds(self._ticket):  # (held but not yet marked: Ctrl-C between the two)
            if self._gate.busy(self._ticket):  # still the holder (not preempted)
                try:
                    stats = self._finish_engine()
                    if self.stats is None:
                        self.stats = stats
                    if cancelled and self.finish_reason is None:
                        self.finish_reason = "cancelled"
                finally:  # even if finishing raised (the LLM was closed): a held gate would block every later call
                    _through_interrupts(self._gate.leave, self._ticket)
