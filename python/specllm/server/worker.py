"""The worker: one thread that owns the LLM and serves jobs one at a time, in arrival order, from a bounded queue.

The bound counts the jobs that still wait: a job whose client went away while it was queued no longer takes a
place (it stays in the queue until the worker skips it, but a new request is not refused because of it).

A job's events (chunks, the end, an error) go to the request's asyncio queue on the event loop. job.cancel() may
be called from the event loop at any time (the client went away): a queued job is skipped, a running one stops
within one speculative step (one prompt batch during prompt processing) through Stream.cancel().

Once the LLM's steps have judged its cost profile stale (LLM.profile_stale: measured while the machine was busy),
the worker measures it again after `remeasure_after` seconds without a job (LLM.measure_costs) instead of drafting
by it until the next start; a job that comes meanwhile interrupts the measurement within one timed step and runs,
and the next idle spell tries again after twice the wait (up to an hour).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Callable, List, Optional, Union

from .. import costs
from ..llm import LLM
from .metrics import Metrics

log = logging.getLogger("specllm.server")
WAIT_MAX_S = 86400.0  # the longest wait for a due measurement: woken each day, it computes the wait again


class QueueFull(Exception):
    pass


class ServerStopping(Exception):
    """The server is shutting down: queued and running requests end with this error, new ones are refused."""

    def __init__(self):
        super().__init__("the server is shutting down; the request was cancelled (retry once it is back)")


class Job:
    def __init__(self, tokens: List[int], options: dict, loop: asyncio.AbstractEventLoop, metrics: Metrics):
        self.tokens = tokens
        self.options = options
        self.events: asyncio.Queue = asyncio.Queue()
        self.t_submit = time.monotonic()
        self.t_start: Optional[float] = None
        self._loop = loop
        self._metrics = metrics
        self._lock = threading.Lock()
        self._stream = None
        self.cancelled = False
        self.limited = False  # stopped by a limit of its own request (stop()), not cancelled
        self.prompt_logprobs = None  # what its first chunk carried, when asked for (jobs.collect keeps them)

    def cancel(self, error: Optional[Exception] = None) -> None:
        """From any thread: a queued job will be skipped, a running one stops within one step. error (once, if
        not cancelled already): what the request's handler is told, before the chunks still on their way."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            if error is not None:
                self.post("error", error)
            if self.t_start is None:
                self._metrics.cancelled.labels(stage="queued").inc()
            elif self._stream is not None:
                self._stream.cancel()

    def stop(self) -> None:
        """End a running job early by a limit of its request (/infill's n_indent, t_max_predict_ms): a cancel that
        the metrics count as a generation ended by a limit ("length"), not as a client gone."""
        self.limited = True
        self.cancel()

    @property
    def queue_ms(self) -> float:
        return 1000.0 * ((self.t_start or time.monotonic()) - self.t_submit)

    def post(self, kind: str, value=None) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: nobody listens any more
            pass

    def run(self, llm: LLM, metrics: Metrics) -> None:
        """On the worker's thread: skipped when cancelled while queued, else work(); an exception goes to failed()
        (the request fails, the server goes on); "end" is the last event either way."""
        with self._lock:
            if self.cancelled:  # while queued
                self.post("end")
                return
            self.t_start = time.monotonic()
        metrics.queue_seconds.observe(self.t_start - self.t_submit)
        try:
            self.work(llm, metrics)
        except Exception as e:
            self.failed(e)
        finally:
            self.post("end")

    def work(self, llm: LLM, metrics: Metrics) -> None:
        """The generation: a "chunk" event per step."""
        stream = llm.stream(self.tokens, **self.options)
        with self._lock:
            self._stream = stream
            if self.cancelled:
                stream.cancel()
        with stream:
            for chunk in stream:
                self.post("chunk", chunk)
        metrics.finished(stream.stats, "length" if self.limited else stream.finish_reason)
        metrics.prompt_cache_bytes.set(llm.prompt_cache_used)

    def failed(self, e: Exception) -> None:
        log.exception("generation failed")  # a decode error
        self.post("error", e)


class Worker:
    """Owns the LLM (or loads it from a factory on its own thread) and runs jobs in order."""

    def __init__(self, llm: Union[LLM, Callable[[], LLM]], max_queue: int, metrics: Metrics,
                 remeasure_after: float = 10.0):
        self.llm: Optional[LLM] = llm if isinstance(llm, LLM) else None
        self._factory = None if isinstance(llm, LLM) else llm
        self.load_error: Optional[BaseException] = None
        self.on_load_error: Optional[Callable[[BaseException], None]] = None
        self.on_ready: Optional[Callable[[LLM], None]] = None  # called on the worker thread once it is loaded
        self.metrics = metrics
        self.max_queue = max_queue
        self.remeasure_after = remeasure_after  # idle seconds before a stale profile is measured again; 0: never
        self._idle_wait = remeasure_after  # doubled by each interrupted measurement
        self._measuring: Optional[threading.Event] = None  # a measurement decided on: its stop (LLM.measure_costs)
        self._waiting: collections.deque = collections.deque()  # Jobs, and None to stop the thread
        self._cond = threading.Condition()
        self._running: Optional[Job] = None
        self._stopping = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="specllm-worker", daemon=True)
        self._ready = threading.Event()
        self._load_stop = threading.Event()  # set by stop(): a load in progress ends its cost measurement
        metrics.queue_depth.set_function(self.depth)  # read when scraped: a job cancelled while queued leaves it
        if self.llm is not None:
            self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.llm is not None

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def _live(self) -> int:
        # under self._cond
        return sum(1 for j in self._waiting if j is not None and not j.cancelled)

    def depth(self) -> int:
        """Jobs waiting (not those cancelled while they waited)."""
        with self._cond:
            return self._live()

    @property
    def stopping(self) -> bool:
        """stop() was called: the server is shutting down."""
        return self._stopping

    def submit(self, job: Job, admitted: bool = False) -> None:
        """Queue job; QueueFull when max_queue jobs wait, unless admitted: a later choice or prompt of a request
        whose first job was taken (refused midway, an n=3 stream ended after its first choice with queue_full)."""
        with self._cond:
            if self._stopping:
                raise ServerStopping()
            live = self._live()
            if live >= self.max_queue and not admitted:
                raise QueueFull
            self._waiting.append(job)
            self._cond.notify()
            self._interrupt_measuring()  # the job runs now; the measurement waits for the next idle spell

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is queued and running (each ends with ServerStopping), refuse new jobs, and end the thread
        (bounded wait). Called again, it only waits."""
        self._load_stop.set()
        with self._cond:
            self._stopping = True
            dropped = [j for j in self._waiting if j is not None]
            self._waiting.clear()
            self._waiting.append(None)
            self._cond.notify()
            self._interrupt_measuring()
        for job in dropped:
            job.cancel(ServerStopping())
            job.post("end")
        with self._lock:
            if self._running is not None:
                self._running.cancel(ServerStopping())
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _interrupt_measuring(self) -> None:
        """(under _cond) A measurement decided on ends within one timed step, even one not begun yet."""
        if self._measuring is not None:
            self._measuring.set()

    def _remeasure_due(self, idle_from: float) -> Optional[float]:
        """Seconds until a stale profile is to be measured again (<= 0: now), None if it is not (under _cond)."""
        if self.llm is None or self.remeasure_after <= 0 or not self.llm.profile_stale:
            return None
        return idle_from + self._idle_wait - time.monotonic()

    def _measure(self) -> None:
        log.info("the cost profile was judged stale (measured while the machine was busy?): measuring it again "
                 "while no request waits")
        t0 = time.monotonic()
        try:
            done = self.llm.measure_costs(stop=self._measuring)
        except Exception:  # a decode error while measuring: the old costs stay, the server goes on
            log.exception("measuring the cost profile again failed; the costs stay as they were")
            done = False
        finally:
            with self._cond:
                self._measuring = None
        if done:
            self._idle_wait = self.remeasure_after
            self.metrics.profile_measured.labels(outcome="measured").inc()
            log.info("measured the cost profile again in %.1f s: T(1) = %.1f ms", time.monotonic() - t0,
                     self.llm.profile["verify_ms"][0])
        else:
            self._idle_wait = min(3600.0, 2 * self._idle_wait)
            self.metrics.profile_measured.labels(outcome="interrupted").inc()
            log.info("measuring the cost profile again was interrupted by a request; trying again after %.0f s "
                     "without one", self._idle_wait)

    def _loop(self) -> None:
        if self._factory is not None:
            try:
                with costs.stoppable_load(self._load_stop):
                    self.llm = self._factory()
            except BaseException as e:  # reported by /health; the process owner decides what to do
                if self._load_stop.is_set():  # stop() during the load: not the model's failure
                    log.info("loading stopped: the server is stopping")
                else:
                    self.load_error = e
                    if self.on_load_error is not None:  # serve(): it stops the server and raises the error
                        self.on_load_error(e)
                    else:
                        log.error("loading the model failed: %s", e)
            finally:
                self._ready.set()
            if self.llm is not None and self.on_ready is not None and not self._load_stop.is_set():
                self.on_ready(self.llm)
        while True:
            with self._cond:
                idle_from = time.monotonic()
                while not self._waiting:
                    due = self._remeasure_due(idle_from)
                    if due is not None and due <= 0:
                        self._measuring = threading.Event()
                        break
                    self._cond.wait(None if due is None else min(due, WAIT_MAX_S))  # --remeasure-after 1e10:
                    # past threading's TIMEOUT_MAX, the wait raised OverflowError and the worker thread died
                if self._measuring is not None:
                    job = None
                else:
                    job = self._waiting.popleft()
            if self._measuring is not None:
                self._measure()
                continue
            if job is None:
                return
            if self.llm is None:
                job.post("error", self.load_error or RuntimeError("no model loaded"))
                job.post("end")
                continue
            with self._lock:
                self._running = job
            self.metrics.busy.set(1)
            try:
                job.run(self.llm, self.metrics)
            finally:
                self.metrics.busy.set(0)
                with self._lock:
                    self._running = None
