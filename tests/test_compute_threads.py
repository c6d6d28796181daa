"""A thread done decoding holds no pool of CPU workers (cpp/include/specllm/threads.h). llama.cpp's CPU backend
(OpenMP, as llama-cpp-python's wheel is built) keeps a pool of n_threads - 1 workers for every thread that has decoded;
while two are alive on a machine with no more cores than one uses, every barrier of a decode sleeps: a 1-row step of
the 1.5B target ran ~20% slower on a 2-core EPYC, a batch less, so a cost profile measured on a load's own thread after
the main thread had generated read batches cheap and "auto" drafted where it lost. These count the process's threads
(/proc/self/task, less Python's own): a pool of n workers is n threads."""

import gc
import os
import signal
import threading
import time

import pytest

import specllm
from specllm import _core, profile

N_THREADS = 3  # a pool of 2 workers


def threads() -> int:
    """The process's threads that Python did not start (the pools' workers among them), read twice alike: another
    test's daemon thread may be ending meanwhile (gone from threading's list a moment before the system's)."""
    gc.collect()  # earlier tests' LLMs freed now, not during a count
    seen = None
    for _ in range(200):
        now = len(os.listdir("/proc/self/task")) - threading.active_count()
        if now == seen:
            return now
        seen = now
        time.sleep(0.01)
    raise AssertionError("the process's thread count did not settle")


def decode_outside_any_call(llm) -> None:
    """A decode on this thread that no LLM call wraps (as another library's model would run): its pool stays."""
    llm._engine.profile_verify([1, 2], 1, 8)


def test_release_frees_the_calling_threads_pool(tiny, make_llm):
    llm = make_llm(tiny["target"], n_threads=N_THREADS)
    assert _core.release_compute_threads()
    before = threads()
    decode_outside_any_call(llm)
    assert threads() == before + N_THREADS - 1
    assert _core.release_compute_threads()
    assert threads() == before
    assert _core.release_compute_threads()  # none to release: still fine


def test_calls_leave_no_pool_behind(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["draft"], n_threads=N_THREADS, ngram=True)
    _core.release_compute_threads()
    before = threads()
    llm.generate("the quick brown fox", max_tokens=12)
    assert threads() == before
    with llm.stream("the quick brown fox", max_tokens=12) as stream:
        next(stream)
        assert threads() == before + N_THREADS - 1  # a stream between two chunks keeps its pool (no thread per step)
    assert threads() == before
    llm.embed("the quick brown fox")
    assert threads() == before
    llm.reset()
    assert threads() == before


def test_a_generation_on_another_thread_leaves_none_either(tiny, make_llm):
    llm = make_llm(tiny["target"], n_threads=N_THREADS)
    _core.release_compute_threads()
    counts = []

    def work():
        llm.generate("the quick brown fox", max_tokens=8)
        counts.append(threads())  # this thread alive (a Python one: not counted), its pool released
        done.wait(10)

    done = threading.Event()
    before = threads()
    worker = threading.Thread(target=work)
    worker.start()
    try:
        for _ in range(1000):
            if counts:
                break
            threading.Event().wait(0.01)
        assert counts == [before]
    finally:
        done.set()
        worker.join(10)


def test_the_loads_measurement_decodes_alone(tiny, make_llm, tmp_path, monkeypatch):
    """A load measures its costs on a thread of its own (so that Ctrl-C stays responsive): the loading thread's pool,
    left by a decode outside any call (another library's model), goes first."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))
    other = make_llm(tiny["target"], n_threads=N_THREADS)
    _core.release_compute_threads()
    base = threads()
    decode_outside_any_call(other)
    assert threads() == base + N_THREADS - 1
    seen = []
    measure = profile.load_or_measure

    def counting(*args, **kwargs):
        seen.append(threads())
        return measure(*args, **kwargs)

    monkeypatch.setattr(profile, "load_or_measure", counting)
    llm = specllm.LLM(tiny["target"], "ngram", n_threads=N_THREADS, n_ctx=512)
    assert seen == [base]  # the measuring thread is Python's; no pool on this one
    assert llm.profile["verify_ms"][0] > 0


def test_a_forked_child_does_not_wait_for_its_parents_workers(tiny, make_llm):
    """The pool of the thread that forked has no workers in the child (fork copies one thread): releasing it there
    waited for them for ever, so close() in a child (which the gate lets in) hung."""
    llm = make_llm(tiny["target"], n_threads=N_THREADS)
    decode_outside_any_call(llm)  # this thread holds a pool as it forks
    pid = os.fork()
    if pid == 0:  # the child: close what it inherited, then go
        code = 1
        try:
            signal.alarm(20)
            llm.close()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's close() hung")
    assert os.waitstatus_to_exitcode(status) == 0
    _core.release_compute_threads()
