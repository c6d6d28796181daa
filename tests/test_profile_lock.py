"""One process at a time measures costs on a machine: two measuring at once (two servers started together, a chat
beside a server's first load, of one model or two) each timed the other's work, and both kept a busy profile. A load
that finds another process measuring waits for it and takes its profile (or measures its own after it); stopped
meanwhile, it ends at once."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import specllm
from specllm import costs, profile
from specllm.errors import Cancelled

PLAUSIBLE = [10.0 + 5.0 * n for n in range(48)]  # half a step a row: a profile a load takes as it is


def _first_profile(tiny, tmp_path, monkeypatch):
    """The profile's file and its lock, made by a first load (then the profile is removed: none on file)."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))
    specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256).close()
    (path,), (lock,) = tmp_path.glob("*.json"), tmp_path.glob("*.lock")
    measured = json.loads(path.read_text())
    path.unlink()
    return path, lock, measured


def _held(lock):
    """Another process holding the lock until its stdin is closed."""
    code = ("import fcntl, os, sys\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "held\n"
    return child


def _load_in_thread(tiny, stop=None, model="target", n_threads=1):
    box = {}

    def load():
        try:
            with costs.stoppable_load(stop or threading.Event()):
                box["llm"] = specllm.LLM(tiny[model], "ngram", n_threads=n_threads, n_ctx=256)
        except BaseException as e:
            box["error"] = e
    thread = threading.Thread(target=load)
    thread.start()
    return thread, box


def _said(caplog, words, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(words in r.getMessage() for r in caplog.records):
            return True
        time.sleep(0.02)
    return False


def test_a_load_waits_for_another_process_measuring_and_takes_its_profile(tiny, tmp_path, monkeypatch, caplog):
    path, lock, measured = _first_profile(tiny, tmp_path, monkeypatch)
    child = _held(lock)
    try:
        with caplog.at_level("INFO", logger="specllm.profile"):
            caplog.clear()  # the first load's notes (kept when an earlier test set the logger to INFO)
            thread, box = _load_in_thread(tiny)
            assert _said(caplog, "another load (in this process or another) is measuring verify costs on this machine: "
                                  "waiting for it")
            theirs = dict(measured, verify_ms=PLAUSIBLE, draft_token_ms=0.125)
            theirs.pop("noisy", None)
            assert profile.plausible(theirs["verify_ms"])
            path.write_text(json.dumps(theirs))  # the other process's measurement ends
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    thread.join(timeout=30)
    assert not thread.is_alive() and "error" not in box, box
    llm = box["llm"]
    assert llm.profile["verify_ms"] == PLAUSIBLE and llm.profile["draft_token_ms"] == 0.125  # taken, not measured
    assert json.loads(path.read_text()) == theirs
    assert not any("measuring this machine" in r.getMessage() for r in caplog.records)
    llm.close()


@pytest.mark.parametrize("model, n_threads", [("draft", 1), ("target", 2)])
def test_a_load_of_another_model_or_thread_count_waits_too_then_measures(tiny, tmp_path, monkeypatch, caplog, model,
                                                                       n_threads):
    """The lock was per target and settings: a second model (or the same one with other threads) measured beside the
    first, each timing the other's work. It waits now, then measures its own costs."""
    path, lock, _ = _first_profile(tiny, tmp_path, monkeypatch)
    child = _held(lock)
    with caplog.at_level("INFO", logger="specllm.profile"):
        try:
            caplog.clear()
            thread, box = _load_in_thread(tiny, model=model, n_threads=n_threads)
            assert _said(caplog, "waiting for it")
            time.sleep(0.3)
            assert thread.is_alive() and not any("measuring this machine" in r.getMessage() for r in caplog.records)
        finally:
            child.stdin.close()
            child.wait(timeout=30)
        thread.join(timeout=60)
    assert not thread.is_alive() and "error" not in box, box
    assert any("measuring this machine" in r.getMessage() for r in caplog.records)  # its own, after the wait
    assert box["llm"].profile is not None and len(list(tmp_path.glob("*.json"))) == 1 and not path.exists()
    box["llm"].close()


def test_a_load_waits_for_another_load_of_its_own_process_too(tiny, tmp_path, monkeypatch, caplog):
    """Two LLMs loading in one process (a server's worker and a second model) time each other's work as two
    processes do: the lock (an flock, one holder per open) is between them too."""
    from specllm import files

    _, lock, _ = _first_profile(tiny, tmp_path, monkeypatch)
    with caplog.at_level("INFO", logger="specllm.profile"):
        with files.exclusive(lock, 1) as held:  # this thread measuring
            assert held is False
            thread, box = _load_in_thread(tiny)
            assert _said(caplog, "waiting for it")
            assert thread.is_alive()
        thread.join(timeout=60)
    assert not thread.is_alive() and "error" not in box, box
    box["llm"].close()


def test_a_load_stopped_while_it_waits_ends_at_once(tiny, tmp_path, monkeypatch, caplog):
    path, lock, _ = _first_profile(tiny, tmp_path, monkeypatch)
    child = _held(lock)
    try:
        stop = threading.Event()
        with caplog.at_level("INFO", logger="specllm.profile"):
            thread, box = _load_in_thread(tiny, stop)
            assert _said(caplog, "waiting for it")
            stop.set()
            began = time.monotonic()
            thread.join(timeout=30)
        assert not thread.is_alive() and time.monotonic() - began < 2.0
        assert isinstance(box.get("error"), Cancelled), box
        assert "waited for another process" in str(box["error"]) and not path.exists()
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_lock_that_cannot_be_made_measures_as_before(tiny, tmp_path, monkeypatch):
    path, lock, _ = _first_profile(tiny, tmp_path, monkeypatch)
    lock.unlink()
    lock.mkdir()  # not a file: no lock can be had
    llm = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256)
    assert llm.profile is not None and path.exists()
    llm.close()


@pytest.mark.parametrize("wait_s", [0.2])
def test_a_lock_held_too_long_is_given_up(tmp_path, wait_s):
    from specllm import files

    lock = tmp_path / "x.lock"
    lock.touch()
    child = _held(lock)
    try:
        waits = []
        began = time.monotonic()
        with files.exclusive(lock, wait_s, lambda: waits.append(1)) as held:
            assert held is None and waits == [1] and wait_s <= time.monotonic() - began < wait_s + 1
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    with files.exclusive(lock, wait_s) as held:
        assert held is False


def test_a_wait_ended_by_an_error_closes_its_descriptor(tmp_path):
    """A wait that stopped() ends by raising (a stopped load, Ctrl-C, the exit) left the lock file open: one descriptor
    more at every server stop during a wait."""
    from specllm import files

    lock = tmp_path / "x.lock"
    lock.touch()
    child = _held(lock)
    try:
        before = len(os.listdir("/proc/self/fd"))

        def stopped():
            raise Cancelled("stopped")
        for _ in range(5):
            with pytest.raises(Cancelled):
                with files.exclusive(lock, 30, stopped=stopped):
                    pass
        assert len(os.listdir("/proc/self/fd")) == before and not files._held
    finally:
        child.stdin.close()
        child.wait(timeout=30)


FORK_WHILE_WAITING = """
import os, subprocess, sys, threading, time
from specllm import files
lock = sys.argv[1]
holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                           "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", lock],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline() == "held\\n"
waiting, done = threading.Event(), threading.Event()

def measure():  # a load waiting for another process's measurement, on a server's worker thread
    with files.exclusive(lock, 30, waiting.set):
        pass
    done.set()

threading.Thread(target=measure).start()
waiting.wait(10)
pid = os.fork()
if pid == 0:
    time.sleep(3)  # a pool's worker living on
    os._exit(0)
holder.kill()  # (its stdin's write end is in the child too: closing it here would not end it)
holder.wait()
done.wait(10)  # the thread took the lock and let it go
with files.exclusive(lock, 1.0) as held:
    print("held by the child" if held is None else "taken", flush=True)
os.waitpid(pid, 0)
"""


def test_a_child_forked_while_a_thread_waits_for_the_lock_does_not_keep_it(tmp_path):
    """The descriptor joined the fork hook's set only once the lock was taken: a child forked during the wait kept a
    copy, and the lock the parent then took and let go stayed held for as long as the child lived."""
    (tmp_path / "x.lock").touch()
    r = subprocess.run([sys.executable, "-c", FORK_WHILE_WAITING, str(tmp_path / "x.lock")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["taken"], r.stdout


FORK = """
import os, sys, threading, time
from specllm import costs, files
lock = sys.argv[1]
inside, leave = threading.Event(), threading.Event()

def loading():  # a load on another thread (a server's worker): the exit waits for it
    with costs.exit_waits():
        inside.set()
        leave.wait()

threading.Thread(target=loading, daemon=True).start()
inside.wait()
with files.exclusive(lock, 1):  # measuring: the lock held
    pid = os.fork()
    if pid == 0:
        time.sleep(3)  # a pool's worker living on
        if "detect_leaks=1" in os.environ.get("ASAN_OPTIONS", ""):  # .ci/sanitize: LeakSanitizer's exit check in
            import atexit                                          # a forked child can wait for ever on a lock
            atexit._run_exitfuncs()                                # another thread held at the fork: the exit
            os._exit(0)                                            # hooks run, then no check
        sys.exit(0)  # was 10 s: the exit waited for the parent's load, whose thread is not here
if pid:
    with files.exclusive(lock, 1.0) as held:  # another open file taking it while the child lives (as soon as
        print("held by the child" if held is None else "taken", flush=True)  # the child has run: it may wait)
    leave.set()
    began = time.monotonic()
    os.waitpid(pid, 0)
    print("child exited after %.1f s" % (time.monotonic() - began), flush=True)
"""


def test_a_forked_child_holds_no_lock_of_its_parent_and_waits_for_none_of_its_loads(tmp_path):
    r = subprocess.run([sys.executable, "-c", FORK, str(tmp_path / "x.lock")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "taken"
    assert float(lines[1].split()[3]) < 5.0, lines


def test_the_target_costs_a_draft_model_pair_measured_serve_the_n_gram_drafter(tiny, tmp_path, monkeypatch, caplog):
    """A load that waited for a process measuring another drafter (a draft model) found no profile of its own and
    measured a minute again: the pair's measurement now also keeps the target's verify costs for n-gram drafting."""
    from specllm import _core

    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))  # a quiet machine's costs (the tiny models' read busy)
    monkeypatch.setattr(_core.Engine, "profile_verify", lambda self, sizes, n_reps, n_prefix=32: PLAUSIBLE[:max(sizes)])
    pair = specllm.LLM(tiny["target"], tiny["draft"], ngram=False, n_threads=1, n_ctx=256)
    assert len(list(tmp_path.glob("*.json"))) == 2
    with caplog.at_level("INFO", logger="specllm.profile"):
        caplog.clear()
        lookup = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256)
    assert not any("measuring this machine" in r.getMessage() for r in caplog.records)
    assert lookup.profile["verify_ms"] == pair.profile["verify_ms"] and lookup.profile["draft_token_ms"] == 0.0
