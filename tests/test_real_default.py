"""The configuration users get — `specllm.LLM("qwen2.5-coder-1.5b")`: the 0.5B draft with n-gram lookup beside it
(hybrid), draft_length="auto" with a measured cost profile — on real prompts, two of them 700+ tokens long, in both
modes: greedy speculative output against the same LLM's plain decoding (draft_length=0).

The README states what these tests assert (Limits): exact mode matches plain decoding on every short prompt, and
on long prompts too unless llama.cpp's multi-threaded attention flips a near-tie; exact=False lets llama.cpp's batch
kernels round differently from single-token decoding, so near-ties flip more often. How many replies flip moves
from run to run (4 to 9 of 12 equal in fast mode on the third VM: "auto" picks batch sizes from timing, and each
size rounds its own way), so the test does not count them: it checks that every reply that differs from plain
decoding differs first at a near-tie of the target's own logits, computed apart by llama-cpp-python. A verifier
that kept a token the target did not choose, or a KV cache cut in the wrong place, differs where the target's best
token leads by whole logits (2-12 at typical positions of these replies)."""

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
# exact mode equals plain decoding on every short prompt (its 3-row verify chunks run the single-token kernels); on
# the two long ones llama.cpp's multi-threaded attention may flip a near-tie in either mode (one of them matched on
# the second VM, neither on the third). A near-tie: the two tokens' logits, computed apart, within this much (the
# flips seen on the third VM were within 0.13; the target's best token leads its second by 2-12 at typical
# positions)
NEAR_TIE = 0.5


def long_prompts():
    rows = [json.loads(line) for line in FRESH.read_text(encoding="utf-8").splitlines()]
    return [r["turns"][0] for r in rows if r["id"] in LONG_IDS]


@pytest.fixture(scope="module")
def target_logits(real_models):
    """logits(tokens): the target's next-token logits after tokens, from llama-cpp-python (the same libllama, loaded
    apart: specllm's engine gives no logits out)."""
    import llama_cpp
    import numpy as np

    ref = llama_cpp.Llama(real_models["target"], n_ctx=2048, n_threads=2, verbose=False)

    def logits(tokens):
        ref.reset()
        ref.eval(tokens)
        return np.ctypeslib.as_array(ref._ctx.get_logits(), shape=(ref.n_vocab(),)).copy()

    yield logits
    ref.close()


def tie_gap(logits, prompt, a, b, eog=()):
    """|logit gap| between the first tokens where continuations a and b of prompt differ (None if they do not). A
    reply that ended where the other goes on chose an end-of-generation token there (the best of eog)."""
    i = first_divergence(a, b)
    if i is None:
        return None
    lg = logits(prompt + list(a[:i]))
    ended = max(float(lg[t]) for t in eog) if eog else float("-inf")
    x, y = (float(lg[c[i]]) if i < len(c) else ended for c in (a, b))
    return abs(x - y)


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
            plain = llm.chat(messages, max_tokens=N, draft_length=0, logprobs=5)
            spec = llm.chat(messages, max_tokens=N, logprobs=5)  # the default: "auto"
            runs.append((llm.prompt_tokens(llm.apply_chat_template(messages)), plain, spec))
        target = llm._engine.target
        eog = [t for t in range(target.n_vocab) if target.is_eog(t)]
        yield request.param, runs, eog


def test_the_tie_check_flags_a_token_the_target_did_not_choose(real_models, target_logits):
    import specllm

    with specllm.LLM(real_models["target"], draft=None, n_threads=2, n_ctx=2048) as llm:
        messages = [{"role": "user", "content": SHORT[0]}]
        prompt = llm.prompt_tokens(llm.apply_chat_template(messages))
        plain = llm.chat(messages, max_tokens=12).tokens
    assert tie_gap(target_logits, prompt, plain, plain) is None
    lg = target_logits(prompt + plain[:5])
    assert int(lg.argmax()) == plain[5]  # the reference agrees with specllm's plain decoding here
    tenth = int(lg.argsort()[-10])  # the target's 10th choice at token 5
    assert tie_gap(target_logits, prompt, plain, plain[:5] + [tenth]) > NEAR_TIE


def test_the_default_configuration_matches_plain_decoding(mode_runs, target_logits):
    mode, runs, eog = mode_runs
    assert len(runs) == 12 and sum(r[1].stats.n_prompt >= 700 for r in runs) == 2
    equal, report, gaps = 0, [], []
    for prompt, plain, spec in runs:
        assert plain.stats.n_drafted == 0 and spec.stats.n_generated == len(spec.tokens)
        i = first_divergence(plain.tokens, spec.tokens)
        equal += i is None
        gap = tie_gap(target_logits, prompt, plain.tokens, spec.tokens, eog)
        gaps.append(gap)
        report.append(f"{plain.stats.n_prompt:4d} prompt tokens, drafted {spec.stats.n_drafted:3d}, accepted "
                      f"{spec.stats.n_accepted:3d}: " + ("equal" if i is None else
                                                        f"first divergence at {i}, logit gap {gap:.3f}"))
    print(f"\n{mode}: {equal}/12 equal to plain decoding\n" + "\n".join(report))
    drafted = sum(r[2].stats.n_drafted for r in runs)
    assert drafted > 0, "auto drafted nothing on 12 prompts: the test exercised nothing"
    message = f"{mode}: {equal}/12 equal to plain decoding\n" + "\n".join(report)
    assert all(g is None or g <= NEAR_TIE for g in gaps), message  # every difference is a near-tie
    if mode == "exact":
        short_equal = sum(first_divergence(p.tokens, s.tokens) is None for _, p, s in runs if p.stats.n_prompt < 512)
        assert short_equal == 10, message


def test_logprobs_of_drafted_tokens_are_the_targets(mode_runs):
    """Each reply's logprobs come from the rows that chose its tokens: greedy, the emitted token is its row's most
    likely one (a token read from another row is not), and where speculative and plain replies agree their
    logprobs agree up to the verify batch's rounding (measured over the 12 replies: median 0 exact, 0.00006 fast;
    largest 0.22 exact, 0.14 fast; the rounding moves a logit by up to 0.65, README)."""
    mode, runs, _ = mode_runs
    diffs = []
    for _, plain, spec in runs:
        for c in (plain, spec):
            assert len(c.logprobs) == len(c.tokens) and all(len(e.top) == 5 for e in c.logprobs)
            assert all(e.token == e.top[0][0] and e.logprob == e.top[0][1] <= 0 for e in c.logprobs)
        i = first_divergence(plain.tokens, spec.tokens)
        n = len(spec.tokens) if i is None else i
        diffs += [abs(a.logprob - b.logprob) for a, b in zip(plain.logprobs[:n], spec.logprobs[:n])]
    diffs.sort()
    print(f"\n{mode}: |logprob speculative - plain| over {len(diffs)} tokens: median {diffs[len(diffs) // 2]:.5f}, "
          f"largest {diffs[-1]:.4f}")
    assert diffs[len(diffs) // 2] < 0.01 and diffs[-1] < 1.0


def test_fill_in_the_middle_writes_the_missing_line(real_models):
    # an editor's cursor inside a function: the default configuration writes the body (the instruct model then
    # often writes on past the middle: editors cut there, or ask with a stop sequence); the prompt uses
    # Qwen2.5-Coder's own FIM tokens (llama-cpp-python 0.3.36 sends token 0 for them)
    import specllm

    with specllm.LLM(real_models["target"], real_models["draft"], n_threads=2, n_ctx=1024) as llm:
        assert llm._engine.target.fim_tokens == {"pre": 151659, "suf": 151661, "mid": 151660, "rep": 151663,
                                                 "sep": 151664}
        c = llm.generate("def add(a, b):\n    ", suffix="\n\n\nprint(add(2, 3))\n", max_tokens=24, stop=["\n\n"])
    assert c.text == "return a + b" and c.finish_reason == "stop", c
