"""The configuration users get — `specllm.LLM("qwen2.5-coder-1.5b")`: the 0.5B draft with n-gram lookup beside it
(hybrid), draft_length="auto" with a measured cost profile — on real prompts, two of them 700+ tokens long, in both
modes: greedy speculative output against the same LLM's plain decoding (draft_length=0).

The README states the equality rates these tests assert (Limits): exact mode matches plain decoding on every
short prompt, and on long prompts too unless llama.cpp's multi-threaded attention flips a near-tie; exact=False
lets llama.cpp's batch kernels round differently from single-token decoding, so near-ties flip more often."""

import json
import pathlib

import pytest

from helpers import first_divergence

pytestmark = pytest.mark.real

N = 64
FRESH = pathlib.Path(__file__).resolve().parents[1] / "bench" / "prompts" / "fresh.jsonl"
SHORT = [
    "Write a Python function that checks whether a number is prime.",
    "Write a JavaScript function that reverses a string.",
    "Write a SQL query that returns the ten most recent rows of a table named orders.",
    "Explain in two sentences what a hash table is.",
    "Write a short paragraph about the history of the Unix operating system.",
    "List five common HTTP status codes and what they mean.",
    "Give me a numbered list of the steps to make a cup of tea.",
    "What is 17 times 23? Show your work.",
    "Solve for x: 3x + 7 = 22.",
    "Add type hints to this function:\n\ndef area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n"
    "    return 2 * (w + h)\n",
]
LONG_IDS = ("fresh-summarization-6", "fresh-rag-5")  # 838 and 864 tokens with the chat template
# the rates the README states (Limits): exact mode equals plain decoding on every short prompt (its 3-row verify
# chunks run the single-token kernels); on the two long ones llama.cpp's multi-threaded attention may flip a
# near-tie in either mode (one of them matched on the second VM, neither on the third), so they are reported, not
# counted. Fast mode: at least this many of all 12
MIN_EQUAL_FAST = 5


def long_prompts():
    rows = [json.loads(line) for line in FRESH.read_text(encoding="utf-8").splitlines()]
    return [r["turns"][0] for r in rows if r["id"] in LONG_IDS]


@pytest.fixture(scope="module", params=["exact", "fast"])
def mode_runs(request, real_models):
    import specllm

    with specllm.LLM(real_models["target"], real_models["draft"], ngram=True, n_threads=2, n_ctx=2048,
                     exact=request.param == "exact") as llm:
        assert llm.profile is not None  # "auto" decides from a measured profile (cached after its first run)
        prompts = SHORT + long_prompts()
        runs = []
        for question in prompts:
            messages = [{"role": "user", "content": question}]
            plain = llm.chat(messages, max_tokens=N, draft_length=0)
            spec = llm.chat(messages, max_tokens=N)  # the default: "auto"
            runs.append((question, plain, spec))
        yield request.param, llm.count_tokens, runs


def test_the_default_configuration_matches_plain_decoding(mode_runs):
    mode, count_tokens, runs = mode_runs
    assert len(runs) == 12 and sum(r[1].stats.n_prompt >= 700 for r in runs) == 2
    equal, report = 0, []
    for question, plain, spec in runs:
        assert plain.stats.n_drafted == 0 and spec.stats.n_generated == len(spec.tokens)
        i = first_divergence(plain.tokens, spec.tokens)
        equal += i is None
        report.append(f"{plain.stats.n_prompt:4d} prompt tokens, drafted {spec.stats.n_drafted:3d}, accepted "
                      f"{spec.stats.n_accepted:3d}: " + ("equal" if i is None else f"first divergence at {i}"))
    print(f"\n{mode}: {equal}/12 equal to plain decoding\n" + "\n".join(report))
    drafted = sum(r[2].stats.n_drafted for r in runs)
    assert drafted > 0, "auto drafted nothing on 12 prompts: the test exercised nothing"
    message = f"{mode}: {equal}/12 equal to plain decoding\n" + "\n".join(report)
    if mode == "exact":
        short_equal = sum(first_divergence(p.tokens, s.tokens) is None for _, p, s in runs if p.stats.n_prompt < 512)
        assert short_equal == 10, message
    else:
        assert equal >= MIN_EQUAL_FAST, message
