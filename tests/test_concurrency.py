"""Concurrency (issue 14): 8 threads share one LLM while, at the same time, 4 threads each use an LLM of their own;
every generate / chat / stream call gives exactly what it gives when the same calls run one after the other on a
fresh LLM with the same settings (greedy and sampled with a seed). Every wait is bounded: a deadlock fails the
test (with every thread's stack on stderr) instead of hanging it."""

import faulthandler
import sys
import threading
import time

import pytest

N_SHARED, N_OWN, ROUNDS = 8, 4, 2
TIMEOUT = 120.0  # for the whole concurrent run (~2 s here)
WORDS = "the quick brown fox jumps over the lazy dog while lorem ipsum dolor sit amet hello world".split()


def calls_of(thread):
    """The calls of one thread: (kind, prompt or messages, options); different prompts and seeds per thread. No
    two prompts share a prefix (bar BOS and the chat template's header) unless they are equal: a prompt that shares
    part of the cached one reuses KV rows computed in another batch, and on some CPUs (seen on a 2-core AMD EPYC VM)
    that alone flips a near-tie of the tiny model's greedy output, as llama.cpp warns for its prompt cache -- history,
    not concurrency."""
    words = WORDS[thread % len(WORDS):] + WORDS[:thread % len(WORDS)]
    prompt = " ".join(words[:6 + thread % 5])
    other = " ".join(reversed(words[:5 + thread % 3]))
    messages = [{"role": "user", "content": f"{words[0]} {words[1]} number {thread}"}]
    sampled = dict(temperature=0.8, top_k=40, draft_length=3)
    return [
        ("generate", prompt, dict(max_tokens=32)),
        ("generate", other, dict(max_tokens=32, seed=100 + thread, **sampled)),
        ("chat", messages, dict(max_tokens=24)),
        ("stream", other, dict(max_tokens=32)),
        ("stream", prompt, dict(max_tokens=32, seed=200 + thread, **dict(sampled, temperature=1.0))),
        ("chat-stream", messages, dict(max_tokens=24, seed=300 + thread, **sampled)),
        ("generate", f"{'ABCDEFGHIJKL'[thread]}: {prompt} {other}", dict(max_tokens=24, draft_length=2)),
    ]


def run(llm, call):
    kind, prompt, options = call
    if kind in ("generate", "chat"):
        c = llm.generate(prompt, **options) if kind == "generate" else llm.chat(prompt, **options)
        return c.text, tuple(c.tokens), c.finish_reason
    chunks = list(llm.stream(prompt, **options) if kind == "stream" else llm.chat(prompt, stream=True, **options))
    return "".join(c.text for c in chunks), tuple(t for c in chunks for t in c.tokens), chunks[-1].finish_reason


@pytest.fixture(scope="module")
def setups(tiny):
    """(target, draft, ngram) of the shared LLM, then of each own LLM."""
    shared = (tiny["target"], tiny["near_draft"], True)  # hybrid, with partial accepts
    own = [(tiny["target"], tiny["draft"], False), (tiny["target"], "ngram", False), (tiny["target"], None, False),
           (tiny["target"], tiny["near_draft"], False)]
    return shared, own


def test_threads_sharing_an_llm_and_threads_with_their_own_give_the_serial_outputs(setups, make_llm):
    shared_setup, own_setups = setups

    def new(setup):
        target, draft, ngram = setup
        return make_llm(target, draft, ngram=ngram)

    # the serial reference: the same calls, one after the other, on fresh LLMs with the same settings
    ref_llm = new(shared_setup)
    reference = {("shared", t): [run(ref_llm, c) for c in calls_of(t)] for t in range(N_SHARED)}
    for j, setup in enumerate(own_setups):
        reference[("own", j)] = [run(new(setup), c) for c in calls_of(N_SHARED + j)]
    assert all(r[2] in ("length", "stop") and r[1] for rs in reference.values() for r in rs)

    shared = new(shared_setup)
    own = [new(setup) for setup in own_setups]
    start = threading.Barrier(N_SHARED + N_OWN)
    results, errors = {}, []

    def worker(key, llm, calls):
        try:
            start.wait(30)
            results[key] = [[run(llm, c) for c in calls] for _ in range(ROUNDS)]
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append((key, e))

    threads = [threading.Thread(target=worker, args=(("shared", t), shared, calls_of(t)), daemon=True)
               for t in range(N_SHARED)]
    threads += [threading.Thread(target=worker, args=(("own", j), own[j], calls_of(N_SHARED + j)), daemon=True)
                for j in range(N_OWN)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, TIMEOUT - (time.monotonic() - t0)))
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail(f"threads still running after {TIMEOUT} s (a deadlock?): {hung}")
    assert not errors, errors
    for (who, n), ref in reference.items():
        calls = calls_of(n + (N_SHARED if who == "own" else 0))
        for r, got in enumerate(results[(who, n)]):
            assert len(got) == len(ref)
            for i, (g, want) in enumerate(zip(got, ref)):
                assert g == want, f"{who} thread {n}, round {r}, call {i}: {calls[i]}"
    # and the shared LLM goes on giving the serial outputs afterwards
    assert run(shared, calls_of(0)[0]) == reference[("shared", 0)][0]
