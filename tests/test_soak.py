"""Soak and lifetime (issue 14): close() and `with LLM(...)` free both models at once, a closed LLM says so on every
call, and 1000 generations across create/close cycles, set_draft swaps, abandoned and cancelled streams leak
neither memory nor file descriptors, with the same outputs all along.

Whether a model is loaded is read from the process itself: llama.cpp maps a GGUF file while its model lives, so
/proc/self/maps lists the file's path exactly as long as the model is loaded (the tests use private copies of the
tiny models, which nothing else in the session maps)."""

import ctypes
import gc
import os
import shutil
import threading
import time
import weakref

import pytest

import specllm

IDLE = 0.05  # stream_idle_timeout of the soak: an abandoned stream costs the next call 50 ms


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallinfo2  # noqa: B018 - glibc >= 2.33
    except (OSError, AttributeError):
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc.mallinfo2.restype = Mallinfo2
    return libc


GLIBC = _glibc()


def memory():
    """(RSS, RSS once the allocator has returned its free pages, bytes malloc'd and not freed), after a collection.
    glibc keeps freed heap memory (up to the whole arena: ~50-100 MB here, with 6 MB in use) and returns it at
    moments of its own: the raw RSS swings by 10% from one cycle to the next with no change in what is in use."""
    gc.collect()
    raw = rss_bytes()
    if GLIBC is None:
        return raw, raw, None
    GLIBC.malloc_trim(0)
    m = GLIBC.mallinfo2()
    return raw, rss_bytes(), m.uordblks + m.hblkhd


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def mapped(path):
    """How many mappings of the file at path the process has (llama.cpp maps a model's file while it is loaded)."""
    path = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return sum(line.rstrip("\n").endswith(" " + path) for line in f)


@pytest.fixture
def models(tiny, tmp_path):
    """Private copies of the tiny target and draft."""
    out = {}
    for role, src in (("target", tiny["target"]), ("draft", tiny["draft"])):
        out[role] = shutil.copy(src, tmp_path / f"soak-{role}.gguf")
    return out


def new_llm(models, draft, ngram=False, **kw):
    kw = dict(dict(n_threads=1, n_ctx=256, profile_costs=False, stream_idle_timeout=IDLE), **kw)
    return specllm.LLM(models["target"], models.get(draft, draft), ngram=ngram, **kw)


def assert_freed(engine_ref, *paths):
    assert engine_ref() is None, "the C++ engine outlived close()"
    for p in paths:
        assert mapped(p) == 0, f"{p} is still mapped after close()"


def run_bounded(fn, timeout=30.0, name=None):
    """fn() on a daemon thread; its result or exception. A hang fails the test instead of hanging it."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{name or getattr(fn, '__name__', fn)} did not return within {timeout} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# --- lifetime

@pytest.mark.parametrize("how", ["with", "close"])
def test_close_frees_both_models_at_once(models, how):
    llm = new_llm(models, "draft")
    engine = weakref.ref(llm._engine)
    assert mapped(models["target"]) >= 1 and mapped(models["draft"]) >= 1  # the measure works: both are loaded
    if how == "with":
        with llm:
            assert llm.generate("hello", max_tokens=4, draft_length=3).stats.n_drafted > 0
    else:
        llm.generate("hello", max_tokens=4, draft_length=3)
        llm.close()
    assert llm.closed
    assert_freed(engine, models["target"], models["draft"])  # at once: no garbage collection needed


def test_close_frees_the_models_while_the_caller_still_holds_a_stream(models):
    # a stream kept after it ended (the usual `s = llm.stream(...); for c in s: ...` inside a with block) must not
    # keep the models: it did, through its reference to the engine, until the stream object itself was collected
    with new_llm(models, "draft") as llm:
        engine = weakref.ref(llm._engine)
        finished = llm.stream("hello", max_tokens=4)
        assert list(finished)[-1].finish_reason == "length"
        cancelled = llm.stream("hello", max_tokens=4)
        cancelled.cancel()
        assert [c.finish_reason for c in cancelled] == ["cancelled"]
        never_started = llm.stream("hello", max_tokens=4)
        preempted = llm.stream("hello", max_tokens=40)
        next(preempted)  # left open: close() takes it over after the idle timeout
    assert_freed(engine, models["target"], models["draft"])
    assert [c.finish_reason for c in preempted] == ["cancelled"]
    with pytest.raises(specllm.SpecLLMError, match="closed"):
        next(never_started)
    del finished, cancelled, preempted, never_started


def under_asan() -> bool:
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def test_close_returns_the_memory_of_both_models(tiny, tmp_path):
    # the 83 MB tiny model as the target and (a copy, so that each has its own file) as the draft: once a
    # generation has touched their weights, they account for ~166 MB of the RSS, which close() gives back
    target = tiny["slow"]
    draft = shutil.copy(tiny["slow"], tmp_path / "slow-draft.gguf")
    size = os.path.getsize(target)
    try:
        before = memory()[1]
        llm = specllm.LLM(target, draft, n_threads=1, n_ctx=256, profile_costs=False)
        llm.generate("hello", max_tokens=3, draft_length=2)
        loaded = memory()[1]
        llm.close()
        freed = memory()[1]
        print(f"\nRSS (trimmed) MB: before {before / 1e6:.1f}, both loaded {loaded / 1e6:.1f}, "
              f"closed {freed / 1e6:.1f} (each model {size / 1e6:.1f})")
        assert loaded - before > 1.5 * size
        assert loaded - freed > 1.5 * size
        if not under_asan():  # ASan holds freed heap in its quarantine (RSS); LeakSanitizer checks leaks there
            assert freed - before < 0.1 * size
        assert mapped(target) == mapped(draft) == 0
    finally:
        os.remove(draft)


def test_every_call_after_close_raises_the_closed_error(models):
    llm = new_llm(models, "draft")
    stream_before = llm.stream("hello", max_tokens=4)  # made before close(), first advanced after it
    llm.close()
    calls = {
        "generate": lambda: llm.generate("hello", max_tokens=4),
        "generate(tokens)": lambda: llm.generate([1, 260, 261], max_tokens=4),
        "stream": lambda: llm.stream("hello", max_tokens=4),
        "chat": lambda: llm.chat([{"role": "user", "content": "hi"}], max_tokens=4),
        "chat(stream)": lambda: llm.chat([{"role": "user", "content": "hi"}], stream=True),
        "set_draft(model)": lambda: llm.set_draft(models["draft"]),
        "set_draft(ngram)": lambda: llm.set_draft("ngram"),
        "set_draft(None)": lambda: llm.set_draft(None),
        "reset": llm.reset,
        "tokenize": lambda: llm.tokenize("hi"),
        "n_ctx": lambda: llm.n_ctx,
    }
    with pytest.raises(specllm.SpecLLMError, match="closed"):
        run_bounded(lambda: next(stream_before), timeout=10)
    # a stream that found its LLM closed must not keep the LLM's gate: calls that wait for the gate
    # (set_draft, reset) hung forever after it
    for name, call in calls.items():
        with pytest.raises(specllm.SpecLLMError, match="closed"):
            run_bounded(call, timeout=10, name=name)
    llm.close()  # twice: harmless
    with llm:  # and leaving a with block of a closed LLM too
        pass
    assert llm.closed and "closed" in repr(llm)


# --- the soak

N_GENERATIONS = 1000
WARMUP = 100  # generations before the reference measurement (allocator arenas, caches, lazily created state)
DRAFTERS = [("draft", False), ("ngram", False), (None, False), ("draft", True)]  # (drafter, hybrid n-gram)
PROMPT = "the quick brown fox jumps over the lazy dog"
OTHER = "lorem ipsum dolor sit amet, consectetur"
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


class Soak:
    """Counts generations and checks that each fixed call (prompt, seed, drafter) gives the same output every
    time it runs, equal to the first time."""

    def __init__(self, models):
        self.models = models
        self.n = 0
        self.refs = {}
        self.threads_left = []

    def same(self, key, completion_or_text):
        value = completion_or_text if isinstance(completion_or_text, str) else (
            completion_or_text.text, tuple(completion_or_text.tokens), completion_or_text.finish_reason)
        first = self.refs.setdefault(key, value)
        assert value == first, f"generation {self.n}: {key} gave {value!r}, first {first!r}"

    def generate(self, llm, prompt, **kw):
        self.n += 1
        c = llm.generate(prompt, **kw)
        assert c.finish_reason in ("length", "stop") and c.tokens, c
        return c

    def cycle(self, i):
        d0, d1, d2 = (DRAFTERS[(i + j) % len(DRAFTERS)] for j in range(3))
        how = ("with", "close", "close with an open stream")[i % 3]
        llm = new_llm(self.models, d0[0], d0[1])
        engine = weakref.ref(llm._engine)
        if how == "with":
            with llm:
                self.body(llm, i, d0, d1, d2)
        else:
            try:
                self.body(llm, i, d0, d1, d2)
                if how == "close with an open stream":
                    left = llm.stream(OTHER, max_tokens=30)
                    self.n += 1
                    next(left)
            finally:
                llm.close()  # takes over the idle stream after IDLE seconds
            if how == "close with an open stream":
                assert [c.finish_reason for c in left] == ["cancelled"]
                del left
        assert llm.closed
        assert_freed(engine, self.models["target"], self.models["draft"])

    def body(self, llm, i, d0, d1, d2):
        # greedy: the same text whatever drafts it (exact mode), whatever the KV cache holds from before
        self.same("greedy", self.generate(llm, PROMPT, max_tokens=8))
        # sampled with a fixed seed and draft length: the same text every time for this drafter
        self.same(("sampled", d0), self.generate(llm, OTHER, max_tokens=8, temperature=0.9, seed=1234,
                                                 draft_length=3))
        self.same("chat", self.generate(llm, llm.apply_chat_template(CHAT), max_tokens=6))
        self.n += 1
        self.same("chat()", llm.chat(CHAT, max_tokens=6).text)

        llm.set_draft(self.models.get(d1[0], d1[0]), ngram=d1[1])
        assert (llm.draft_path is not None) == (d1[0] == "draft")

        # a stream dropped half-way without close(): collected, it frees the LLM at once
        dropped = llm.stream(PROMPT, max_tokens=40, draft_length=2)
        self.n += 1
        next(dropped), next(dropped)
        del dropped
        # a stream left open while another call comes: the call takes it over after IDLE seconds
        left = llm.stream(OTHER, max_tokens=40)
        self.n += 1
        next(left)
        self.same("greedy", self.generate(llm, PROMPT, max_tokens=8))
        assert [c.finish_reason for c in left] == ["cancelled"] and list(left) == []

        # cancel() from another thread between two steps: no step runs after it
        s = llm.stream(PROMPT, max_tokens=60, temperature=0.7, seed=i, draft_length=3)
        self.n += 1
        first = next(s)
        t = threading.Thread(target=s.cancel)
        t.start()
        t.join(10)
        assert not t.is_alive()
        rest = list(s)
        assert [c.finish_reason for c in rest] == ["cancelled"], rest
        assert rest[-1].stats.n_generated == len(first.tokens)

        # cancel() while another thread consumes the stream: it ends cancelled (or had already finished)
        s = llm.chat(CHAT, stream=True, max_tokens=150, temperature=1.0, seed=i)
        self.n += 1
        got_one, reasons = threading.Event(), []

        def consume(stream):
            try:
                for c in stream:
                    reasons.append(c.finish_reason)
                    got_one.set()
            except BaseException as e:  # noqa: BLE001 - checked below
                reasons.append(e)
                got_one.set()

        t = threading.Thread(target=consume, args=(s,), daemon=True)
        t.start()
        assert got_one.wait(10)
        s.cancel()
        t.join(10)
        assert not t.is_alive(), "a cancelled stream did not end"
        assert reasons[-1] in ("cancelled", "length", "stop"), reasons
        del s

        llm.set_draft(self.models.get(d2[0], d2[0]), ngram=d2[1])
        # the KV cache left by the cancels is consistent: the fixed calls give their text again
        self.n += 1
        text = "".join(c.text for c in llm.chat(CHAT, stream=True, max_tokens=6, temperature=0.8, seed=7,
                                                draft_length=3))
        self.same(("chat stream sampled", d2), text)
        self.same("greedy", self.generate(llm, PROMPT, max_tokens=8))
        self.generate(llm, OTHER + f" {i}", max_tokens=5, temperature=0.8, seed=i)


@pytest.mark.slow
def test_soak_1000_generations_leak_nothing(models):
    soak = Soak(models)
    start = memory() + (open_fds(),)
    warm = None
    i = 0
    t0 = time.monotonic()
    while soak.n < N_GENERATIONS:
        soak.cycle(i)
        i += 1
        if warm is None and soak.n >= WARMUP:
            warm = memory() + (open_fds(),)
    end = memory() + (open_fds(),)
    elapsed = time.monotonic() - t0

    def show(m):
        heap = "n/a" if m[2] is None else f"{m[2] / 1e6:.1f}"
        return f"RSS {m[0] / 1e6:.1f}, trimmed {m[1] / 1e6:.1f}, malloc'd {heap} MB, {m[3]} fds"

    print(f"\nsoak: {soak.n} generations in {i} cycles, {elapsed:.1f} s\n  start:         {show(start)}\n"
          f"  after warm-up: {show(warm)}\n  end:           {show(end)}")
    assert len(soak.refs) == 3 + 2 * len(DRAFTERS)  # every fixed call ran, under every drafter
    assert end[1] < warm[1] * 1.05, f"RSS grew {100 * (end[1] / warm[1] - 1):.1f}% after warm-up"
    if end[2] is not None:
        assert end[2] < warm[2] * 1.05, f"memory in use grew {100 * (end[2] / warm[2] - 1):.1f}% after warm-up"
    assert end[3] <= warm[3], f"open file descriptors grew from {warm[3]} to {end[3]}"
