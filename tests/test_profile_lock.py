"""One process at a time measures a target's cost profile: two measuring at once (two servers started together, a chat
beside a server's first load) each timed the other's work, and both kept a busy profile. A load that finds another
process measuring waits for it and takes its profile; stopped meanwhile, it ends at once."""

import json
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


def _load_in_thread(tiny, stop=None):
    box = {}

    def load():
        try:
            with costs.stoppable_load(stop or threading.Event()):
                box["llm"] = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256)
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
            assert _said(caplog, "another process is measuring these costs: waiting for it")
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
