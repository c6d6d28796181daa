"""Streams belong to the LLM, not to a thread: any thread advances or cancels one, a cancel stops the generation
within one step (one prompt batch during prompt processing), and an abandoned stream never blocks the LLM for
longer than stream_idle_timeout. The KV cache stays consistent on every path."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import specllm
from helpers import check_kv

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 60


@pytest.fixture
def llm(tiny, make_llm):
    return make_llm(tiny["target"], tiny["draft"], stream_idle_timeout=0.5)


def test_a_stream_is_advanced_from_several_threads(llm):
    whole = llm.generate(PROMPT, max_tokens=N, draft_length=3)
    stream = llm.stream(PROMPT, max_tokens=N, draft_length=3)
    with ThreadPoolExecutor(3) as pool:  # each next() on whichever pool thread is free
        chunks = []
        while not chunks or chunks[-1].finish_reason is None:
            chunks.append(pool.submit(next, stream).result(timeout=30))
    assert [t for c in chunks for t in c.tokens] == whole.tokens
    assert chunks[-1].finish_reason == "length"


def test_an_unrelated_call_on_a_reused_thread_waits_for_the_open_stream(llm):
    # A server's pool thread that advanced a stream serves another request next: that request waits for the
    # stream (advanced meanwhile by another thread), it is not refused and does not preempt it.
    stream = llm.stream(PROMPT, max_tokens=N, draft_length=3)
    with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
        a.submit(next, stream).result(timeout=30)
        other = a.submit(llm.generate, PROMPT + " again", max_tokens=8)
        rest = b.submit(lambda: [c for c in stream]).result(timeout=30)
        assert other.result(timeout=30).finish_reason == "length"
    assert rest[-1].finish_reason == "length"


def test_an_abandoned_stream_is_closed_after_the_idle_timeout(llm):
    stream = llm.stream(PROMPT, max_tokens=N)
    first = next(stream)
    t0 = time.monotonic()
    again = llm.generate(PROMPT + " more", max_tokens=N)  # same thread: waits 0.5 s, then closes the stream
    waited = time.monotonic() - t0
    assert 0.4 <= waited < 10, waited
    rest = list(stream)
    assert [c.finish_reason for c in rest] == ["cancelled"] and rest[0].stats.n_generated >= len(first.tokens)
    assert list(stream) == []
    check_kv(llm, llm.tokenize(PROMPT + " more"), again)


def test_a_busy_stream_is_not_preempted(llm):
    # a consumer that takes its time between chunks (but less than the idle timeout) keeps its stream
    chunks, done = [], threading.Event()

    def consume():
        for c in llm.stream(PROMPT, max_tokens=20, draft_length=0):
            chunks.append(c)
            time.sleep(0.05)
        done.set()

    t = threading.Thread(target=consume)
    t.start()
    while not chunks:
        time.sleep(0.005)
    other = llm.generate(PROMPT, max_tokens=4)  # admitted once the stream's last chunk is out
    t.join(10)
    assert done.is_set() and chunks[-1].finish_reason == "length" and other.finish_reason == "length"
    assert len(chunks) > 5


def test_cancel_from_another_thread_stops_within_one_step(llm, make_llm, tiny):
    stream = llm.stream(PROMPT, max_tokens=N, draft_length=3)
    first = next(stream)
    threading.Thread(target=stream.cancel).start()
    time.sleep(0.1)
    rest = list(stream)
    assert [c.finish_reason for c in rest] == ["cancelled"], rest  # no step ran after the cancel
    assert rest[-1].stats.n_generated == len(first.tokens)
    assert stream.finish_reason == "cancelled"
    again = llm.generate(PROMPT + " more", max_tokens=N, draft_length=3)
    fresh = make_llm(tiny["target"], tiny["draft"]).generate(PROMPT + " more", max_tokens=N, draft_length=3)
    assert again.tokens == fresh.tokens
    check_kv(llm, llm.tokenize(PROMPT + " more"), again)


def test_cancel_while_running_a_step_ends_after_that_step(llm):
    stream = llm.stream(PROMPT, max_tokens=N, draft_length=3)
    next(stream)
    llm._engine.interrupt()  # as stream.cancel() does while a step runs: the engine ends at the next step
    last = next(stream)
    assert last.finish_reason == "cancelled" and last.tokens == []
    with pytest.raises(StopIteration):
        next(stream)
    assert not llm._engine.interrupted  # cleared for the next generation
    assert llm.generate(PROMPT, max_tokens=8).finish_reason == "length"


def test_cancel_before_the_first_next(llm):
    stream = llm.stream(PROMPT, max_tokens=N)
    stream.cancel()
    chunks = list(stream)
    assert [c.finish_reason for c in chunks] == ["cancelled"] and chunks[0].stats.n_generated == 0
    assert llm.generate(PROMPT, max_tokens=4).finish_reason == "length"


def test_an_interrupt_stops_the_prefill_between_prompt_batches(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["draft"], n_ctx=2048)
    prompt = llm.tokenize(" ".join(["lorem ipsum dolor sit amet"] * 40))
    assert len(prompt) > 600  # at least three prompt batches of 256
    opts = specllm.options.make_options(max_tokens=4, draft_length=3)
    llm._engine.interrupt()
    with pytest.raises(specllm.errors.Cancelled, match="cancelled during prompt processing"):
        llm._engine.start(prompt, opts)
    cached = list(llm._engine.target.cached)
    assert len(cached) == 256 and cached == prompt[:256]  # the first batch ran, and stays cached
    llm._engine.clear_interrupt()
    c = llm.generate(prompt, max_tokens=4)
    assert c.stats.n_cached == 256
    check_kv(llm, prompt, c)


def test_a_dropped_stream_frees_the_llm(llm):
    stream = llm.stream(PROMPT, max_tokens=N)
    next(stream)
    del stream  # collected: closed at once, no idle wait
    t0 = time.monotonic()
    llm.generate(PROMPT, max_tokens=4)
    assert time.monotonic() - t0 < 0.4


EXIT_SCRIPT = """
import atexit, sys, threading, time
import specllm

seen = []
atexit.register(lambda: print("at exit, after specllm's hook:", seen[0].finish_reason if seen else "no stream",
                              flush=True))  # registered first, so it runs after the LLM's own hook
llm = specllm.LLM(sys.argv[1], "ngram", n_threads=1, n_ctx=2048, profile_costs=False)
started = threading.Event()

def run():
    s = llm.stream("once upon a time " * 20, max_tokens=1500)
    seen.append(s)
    for _ in s:
        started.set()
        if sys.argv[2] == "slow-consumer":  # between chunks most of the time: the stream is idle at exit
            time.sleep(0.2)

threading.Thread(target=run, daemon=True).start()
assert started.wait(60)
print("main returns while the daemon generates", flush=True)
"""


def test_exiting_while_a_daemon_thread_generates_cancels_it_first(tiny, tmp_path):
    """A daemon thread inside llama.cpp when Python finalizes is ended by Python in a way C++ cannot unwind: the
    process aborted at times (or ggml printed its crash backtrace after exit). At exit the LLM's hook cancels the
    running generation and waits for it to leave llama.cpp: the stream has ended, as "cancelled", before the
    interpreter goes on."""
    import os
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = dict(os.environ, SPECLLM_PROFILES=str(tmp_path / "profiles"))
    for consumer in ("tight", "slow-consumer"):
        p = subprocess.run([sys.executable, str(script), tiny["slow"], consumer], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        assert "at exit, after specllm's hook: cancelled" in p.stdout, p.stdout + p.stderr[-2000:]
        assert "ptrace" not in p.stderr and "terminate" not in p.stderr and "sat idle" not in p.stderr, p.stderr


def test_a_stream_whose_start_fails_reports_nothing_of_an_earlier_call(llm):
    """A prompt that does not fit raised from the stream's first next(); its stats and the LLM's last_stats were
    the previous generation's, and the finish hooks (memory, cost checks) ran for a call that never ran."""
    llm.generate(PROMPT, max_tokens=8)
    before = llm.last_stats
    s = llm.stream(PROMPT, max_tokens=100000)
    with pytest.raises(specllm.ContextOverflowError):
        next(s)
    assert s.stats is None and llm.last_stats is before
    assert llm.generate(PROMPT, max_tokens=8).stats.n_generated == 8  # the LLM goes on


def test_an_infinite_idle_timeout_never_preempts(tiny, make_llm):
    llm = make_llm(tiny["target"], stream_idle_timeout=float("inf"))
    s = llm.stream(PROMPT, max_tokens=20)
    next(s)
    done = []
    t = threading.Thread(target=lambda: done.append(llm.generate(PROMPT, max_tokens=2)))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not done  # waits behind the open stream (it raised OverflowError at once)
    s.close()
    t.join(30)
    assert done and done[0].stats.n_generated == 2


def test_after_shut_a_thread_that_waited_for_the_gate_is_refused():
    """A thread already waiting behind the running call when the interpreter exits must not be let in once that
    call leaves: it would run a whole generation inside llama.cpp while Python finalizes."""
    from specllm.gate import Call, Gate

    gate, refused, shut = Gate(10.0), [], []
    running = Call(gate)
    gate.enter(running)

    def wait():
        try:
            gate.enter(Call(gate))
        except specllm.SpecLLMError as e:
            refused.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)  # waiting in enter()
    closer = threading.Thread(target=lambda: shut.append(gate.shut(timeout=10)))
    closer.start()
    time.sleep(0.2)
    gate.leave(running)
    waiter.join(10)
    closer.join(10)
    assert shut == [True] and len(refused) == 1 and "interpreter is exiting" in str(refused[0])


def test_a_stream_queued_behind_another_call_ends_at_once_when_cancelled(tiny, make_llm):
    """Its next() waited for the LLM behind the other holder and said "cancelled" only when that ended (3.3 s in
    review), and close() from another thread blocked as long: now both return at once, and nothing of it ran."""
    llm = make_llm(tiny["target"], None, stream_idle_timeout=60.0)
    holder = llm.stream(PROMPT, max_tokens=N)
    next(holder)  # holds the LLM (open, not idle long enough to be preempted)
    for end in ("cancel", "close"):
        queued, got = llm.stream(PROMPT, max_tokens=8), []
        waiter = threading.Thread(target=lambda: got.append(next(queued)))
        waiter.start()
        time.sleep(0.2)
        began = time.monotonic()
        queued.cancel() if end == "cancel" else queued.close()
        waiter.join(30)
        assert time.monotonic() - began < 1.0, end
        assert got[0].finish_reason == "cancelled" and got[0].tokens == [] and queued.finish_reason == "cancelled"
    rest = [c for c in holder]  # the holder goes on as before
    assert rest[-1].finish_reason == "length"
    assert llm.generate(PROMPT, max_tokens=4).finish_reason == "length"


@pytest.mark.parametrize("where", ["leave", "busy"])
def test_ctrl_c_as_the_gate_changes_hands_leaves_it_free(llm, where):
    """A signal's handler runs even as a function is entered: Ctrl-C at the entry of Gate.leave (or of busy, as a
    stream ends) left the gate held by a holder gone, and every later call waited for ever (a reviewer's rapid
    SIGINTs got there after some hundreds). Raised where a real SIGINT's handler would raise it, once."""
    import sys

    from specllm.gate import Gate
    code, armed = getattr(Gate, where).__code__, [True]

    def interrupt(frame, event, arg):
        if event == "call" and frame.f_code is code and armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    calls = [lambda: llm.generate(PROMPT, max_tokens=4)] + ([llm.reset] if where == "leave" else [])
    for call in calls:
        armed[0] = True
        sys.setprofile(interrupt)
        try:
            with pytest.raises(KeyboardInterrupt):
                call()
        finally:
            sys.setprofile(None)
        assert llm._gate._holder is None
        done = []
        t = threading.Thread(target=lambda: done.append(llm.generate(PROMPT, max_tokens=4).finish_reason))
        t.start()
        t.join(30)
        assert done == ["length"]


def test_a_thread_calling_in_a_loop_does_not_starve_another(tiny, make_llm):
    """The gate went to whoever grabbed it first: a thread embedding documents one by one took it back before the
    waiting thread woke, and a chat() waited 30+ s behind 11,674 embeddings (a reviewer's indexer). Waiters are
    admitted in arrival order."""
    llm = make_llm(tiny["target"], "ngram")
    stop, done = threading.Event(), []

    def indexer():
        while not stop.is_set():
            llm.embed("lorem ipsum dolor sit amet " * 12)

    t = threading.Thread(target=indexer, daemon=True)
    t.start()
    time.sleep(0.3)
    try:
        waiter = threading.Thread(target=lambda: done.append(llm.generate("hello", max_tokens=8).text), daemon=True)
        waiter.start()
        waiter.join(10)
        assert done, "generate() waited more than 10 s behind a thread embedding in a loop"
    finally:
        stop.set()
        t.join(10)
