"""A cost profile the steps judged stale is measured again without a restart: LLM.measure_costs() in-process
(interruptible from another thread by its stop Event or stop_measuring(), the old costs kept then), and `specllm-cli
serve`, which
measures it while no request waits (--remeasure-after) and lets a request that comes meanwhile interrupt it."""

import contextlib
import json
import signal
import threading
import time

import httpx
import pytest

import specllm
from specllm import _core, profile

from serving import Server

SLOW = [1000.0 + 500.0 * n for n in range(48)]  # 1 s a step: the tiny models' take well under 10 ms


def _stale_llm(tiny, tmp_path, monkeypatch, model="target", **kw):
    """An LLM whose profile on file is 100-1000 x too dear, judged stale by a generation."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))
    with monkeypatch.context() as m:
        m.setattr(_core.Engine, "profile_verify", lambda self, sizes, n_reps, n_prefix=32: SLOW[:max(sizes)])
        specllm.LLM(tiny[model], "ngram", n_threads=1, n_ctx=256, **kw)
    llm = specllm.LLM(tiny[model], "ngram", n_threads=1, n_ctx=256, **kw)  # from the file, as it is
    assert llm.profile["verify_ms"][0] == SLOW[0] and not llm.profile_stale
    llm.generate("the cat sat on the mat", max_tokens=60, ignore_eos=True)
    assert llm.profile_stale
    (path,) = tmp_path.glob("*.json")
    assert "stale" in json.loads(path.read_text())
    return llm, path


def test_a_stale_profile_is_measured_again_in_process(tiny, tmp_path, monkeypatch):
    llm, path = _stale_llm(tiny, tmp_path, monkeypatch)
    want = specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=256).generate("the cat", max_tokens=30).tokens
    assert llm._engine.step_level()[1] >= profile.STALE_STEPS
    assert llm.measure_costs() is True
    on_file = json.loads(path.read_text())
    assert llm.profile["verify_ms"][0] < 100.0 and on_file["verify_ms"] == llm.profile["verify_ms"]
    assert "stale" not in on_file and on_file["stale_loads"] == 1  # counted as a load that measured it again
    assert not llm.profile_stale
    assert llm._engine.verify_costs()[0] == pytest.approx(llm.profile["verify_ms"][0])
    assert llm._engine.step_level() == (1.0, 0)  # what the steps taught against the old costs starts again
    assert llm.generate("the cat", max_tokens=30).tokens == want  # drafting by the new costs
    # no drafter, or no profiling: nothing to measure
    assert specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=256).measure_costs() is False
    assert specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256, profile_costs=False).measure_costs() is False


def _stopped_midway(llm, measure, stop):
    """measure() on a thread, stop() 0.1 s after the measurement began (the slow tiny model takes ~3 s to measure):
    what measure returned, which must come within a timed step of the stop."""
    result = []
    t = threading.Thread(target=lambda: result.append(measure()))
    t.start()
    deadline = time.monotonic() + 10
    while not llm._costs.measuring and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    t0 = time.monotonic()
    stop()
    t.join(10)
    assert len(result) == 1 and time.monotonic() - t0 < 5.0
    return result[0]


def test_a_stop_set_before_the_measurement_begins_ends_it(tiny, tmp_path, monkeypatch):
    llm, path = _stale_llm(tiny, tmp_path, monkeypatch, model="slow")
    before = json.loads(path.read_text())
    stop = threading.Event()
    stop.set()
    t0 = time.monotonic()
    assert llm.measure_costs(stop=stop) is False and time.monotonic() - t0 < 0.5  # not begun at all
    # set while it waits for a generation that holds the LLM: it does not begin once the generation ends
    stop = threading.Event()
    result = []
    with llm.stream("the cat sat", max_tokens=20) as s:
        next(s)  # the stream holds the LLM now
        t = threading.Thread(target=lambda: result.append(llm.measure_costs(stop=stop)))
        t.start()
        time.sleep(0.2)
        stop.set()
        rest = list(s)
    t.join(10)
    assert result == [False] and rest[-1].finish_reason == "length"
    assert llm.profile_stale and json.loads(path.read_text()) == before
    # set during it: ended within one timed step, the interrupt not left for what follows
    stop = threading.Event()
    result.append(_stopped_midway(llm, lambda: llm.measure_costs(stop=stop), stop.set))
    assert result == [False, False]
    assert llm.generate("the cat", max_tokens=8).finish_reason == "length"
    assert llm.measure_costs(stop=threading.Event()) is True  # a stop never set: measured
    stop.set()  # set after its measurement ended: nothing happens to the next one
    assert llm.generate("the cat", max_tokens=8).finish_reason == "length" and not llm.profile_stale


def test_ctrl_c_while_a_load_measures_ends_it_at_once(tiny, tmp_path, monkeypatch):
    """Ctrl-C while a load measured the costs (a minute on a 2-core CPU) waited for the measurement's end (14-50 s in
    specllm-cli): a C++ call holds Python's signal handlers. The measurement runs on a thread of its own now, and
    Ctrl-C interrupts it within one timed step (a first version joined that thread and crashed the interpreter's
    exit)."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))

    def endless(engine, *args, **kw):  # a slow machine's minute: timed steps until interrupted
        while True:
            try:
                engine.profile_verify([1, 8], 3)
            except specllm.errors.Cancelled:
                seen.append(time.monotonic())
                raise
            if not sent:  # Ctrl-C once the measurement runs (the load's time on a busy machine is not counted)
                sent.append(time.monotonic())
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    seen, sent = [], []
    monkeypatch.setattr(profile, "load_or_measure", endless)
    with pytest.raises(KeyboardInterrupt):
        specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256)
    assert len(seen) == 1 and seen[0] - sent[0] < 5  # interrupted within a timed step, not left to run
    for thread in threading.enumerate():
        if thread.name == "specllm-measure-load":
            thread.join(5)
            assert not thread.is_alive()
    monkeypatch.undo()
    llm = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=256, profile_costs=False)
    assert llm.generate("the cat", max_tokens=4, ignore_eos=True).stats.n_generated == 4


def test_stop_measuring_keeps_the_old_costs(tiny, tmp_path, monkeypatch):
    # the slow tiny model takes ~3 s to measure: interrupted from another thread well before that
    llm, path = _stale_llm(tiny, tmp_path, monkeypatch, model="slow")
    before = json.loads(path.read_text())
    assert _stopped_midway(llm, llm.measure_costs, llm.stop_measuring) is False  # a whole measurement returns True
    assert llm.profile["verify_ms"][0] == SLOW[0] and llm.profile_stale
    assert json.loads(path.read_text()) == before  # nothing written: the next idle spell or load measures it
    out = llm.generate("the cat", max_tokens=8)  # the interrupt was not left for the generation
    assert out.finish_reason == "length"
    llm.stop_measuring()  # outside a measurement: nothing happens
    assert llm.generate("the cat", max_tokens=8).finish_reason == "length"


@contextlib.contextmanager
def _slow_profile_server(tiny, tmp_path, *extra):
    """A server of the slow tiny model whose profile on file says its steps cost 20 x what they do (stopped at the
    end)."""
    env = {"SPECLLM_PROFILES": str(tmp_path / "profiles")}
    args = ("--model", tiny["slow"], "--draft", "ngram", "--threads", "1", "--ctx", "1024")
    s = Server(*args, env=env, log_path=tmp_path / "first.log").wait_healthy()
    assert s.stop(signal.SIGINT) == 0, s.log()
    (path,) = (tmp_path / "profiles").glob("*.json")
    prof = json.loads(path.read_text())
    real = prof["verify_ms"][0]
    # a plausible shape (0.5 T(1) a row), so that the load takes it as it is: the first measurement, scaled, can be
    # one that looks busy (noisy, measured again at the next load) when other work runs beside the tests
    dear = [20 * real * (0.5 + 0.5 * n) if v > 0 else 0.0 for n, v in enumerate(prof["verify_ms"], 1)]
    path.write_text(json.dumps({"sizes": prof["sizes"], "verify_ms": dear, "draft_token_ms": 0.0,
                                "context_row_ms": 0.0}))
    s = Server(*args, *extra, env=env, log_path=tmp_path / "server.log").wait_healthy()
    try:
        yield s, path, real
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()


def _judge(s):
    r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "the cat sat on the mat", "max_tokens": 60,
                                                    "temperature": 0, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text


def test_the_server_measures_a_stale_profile_again_while_idle(tiny, tmp_path):
    with _slow_profile_server(tiny, tmp_path, "--remeasure-after", "0.5") as (s, path, real):
        _judge(s)  # its steps show the profile 20 x too dear: judged stale, then measured while idle
        assert s.wait_metric("specllm_cost_profile_remeasured_total", 1, timeout=60, outcome="measured") == 1
        on_file = json.loads(path.read_text())
        assert "stale" not in on_file and on_file["verify_ms"][0] < 10 * real, (on_file, real)  # was 20 x
        assert "measured the cost profile again" in s.log()
        _judge(s)  # and serves on


def test_a_request_interrupts_the_measurement(tiny, tmp_path):
    with _slow_profile_server(tiny, tmp_path, "--remeasure-after", "0.2") as (s, path, real):
        _judge(s)
        deadline = time.monotonic() + 30
        while "measuring it again while no request waits" not in s.log() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "measuring it again while no request waits" in s.log(), s.log()
        t0 = time.monotonic()
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "the cat", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 10.0, (r.text, time.monotonic() - t0)
        # interrupted, not waited for (the measurement takes ~3 s quiet: the request waited that long without the
        # interrupt, and the outcome was "measured")
        assert s.metric("specllm_cost_profile_remeasured_total", outcome="interrupted") == 1
        assert "stale" in json.loads(path.read_text())  # the old costs kept, on file too
        # idle again (after twice the wait): measured
        assert s.wait_metric("specllm_cost_profile_remeasured_total", 1, timeout=60, outcome="measured") == 1
        assert "stale" not in json.loads(path.read_text())


def test_remeasure_after_0_never_measures(tiny, tmp_path):
    with _slow_profile_server(tiny, tmp_path, "--remeasure-after", "0") as (s, path, real):
        _judge(s)
        time.sleep(1.5)
        assert "stale" in json.loads(path.read_text())
        assert s.metric("specllm_cost_profile_remeasured_total", outcome="measured") == 0


def test_a_huge_remeasure_after_waits_instead_of_killing_the_worker(tiny, tmp_path):
    """--remeasure-after 1e10 passed its check, then the stale profile's wait raised OverflowError (past
    threading.TIMEOUT_MAX): the worker thread died, later requests hung and /health still said ok."""
    with _slow_profile_server(tiny, tmp_path, "--remeasure-after", "1e10") as (s, path, real):
        _judge(s)
        time.sleep(1.0)
        _judge(s)  # served: the worker waits (a day at a time) for a measurement a long way off
        assert "Exception in thread" not in s.log() and "stale" in json.loads(path.read_text())


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "10", True])
def test_a_bad_remeasure_after_is_refused(bad):
    from specllm.server.app import create_app

    with pytest.raises(ValueError, match="remeasure_after"):
        create_app(lambda: None, remeasure_after=bad)


def test_a_bad_remeasure_after_flag_is_a_usage_error():
    import subprocess
    import sys

    for bad in ("-1", "soon", "inf"):
        r = subprocess.run([sys.executable, "-m", "specllm.cli", "serve", "--remeasure-after", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--remeasure-after" in r.stderr and "Traceback" not in r.stderr, r.stderr


class _FakeEngine:
    def __init__(self):
        self.flag = threading.Event()

    def interrupt(self):
        self.flag.set()

    def clear_interrupt(self):
        self.flag.clear()


class _FakeLLM:
    """A stale profile whose measurement takes `begin` s before it looks at the engine's interrupt (the window between
    the worker deciding to measure and the measurement starting), then 1 s unless interrupted."""

    def __init__(self, begin):
        self._engine = _FakeEngine()
        self.begin = begin
        self.profile_stale = True
        self.profile = {"verify_ms": [1.0]}
        self.measured = []  # per measurement: completed (True) or interrupted

    def measure_costs(self, stop=None):  # as Costs.measure: a stop set before it begins ends it too
        time.sleep(self.begin)
        done = not stop.wait(1)
        self.measured.append(done)
        self.profile_stale = not done
        return done


class _FakeJob:
    cancelled = False

    def __init__(self):
        self.ran = threading.Event()
        self.interrupt_left = None

    def run(self, llm, metrics):
        self.interrupt_left = llm._engine.flag.is_set()
        self.ran.set()


def test_a_job_interrupts_a_measurement_the_worker_has_only_decided_on():
    from specllm.server.metrics import Metrics
    from specllm.server.worker import Worker

    llm = _FakeLLM(begin=0.5)
    worker = Worker(lambda: llm, 4, Metrics(), remeasure_after=0.05)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not worker._measuring and time.monotonic() < deadline:
            time.sleep(0.005)
        assert worker._measuring and not llm.measured  # decided on, not begun
        job = _FakeJob()
        t0 = time.monotonic()
        worker.submit(job)
        assert job.ran.wait(5) and time.monotonic() - t0 < 5.0
        assert llm.measured == [False] and job.interrupt_left is False  # interrupted; the flag not left for the job
        deadline = time.monotonic() + 10  # idle again (after twice the wait): measured
        while llm.measured != [False, True] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert llm.measured == [False, True] and not llm._engine.flag.is_set()
    finally:
        worker.stop()
