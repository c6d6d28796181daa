"""How close is "auto" to the best draft-length policy its inputs allow? A replay against a static policy that knows.

    python -m bench.static_policy --train bench/results/copy-heavy-12-prompts/2026-11-23-vm.json \\
        --tasks summarization,rag bench/results/holdout3/2026-11-27-vm.json [more runs ...] [--probability]

The static policy is told, from the plain answers of the --train runs, how far an n-gram proposal agreed with the
answer at every position, grouped by what "auto" sees when it chooses: the match's length bucket, whether the match
is doubtful, and where the proposal crosses the end of a sentence. At each step it drafts the k that maximizes the
expected tokens per ms under that group's empirical distribution (one verify batch, the profile's T(n) and context
cost, the same 1.03 margin over plain decoding as "auto"). With --probability the groups are also split by the
target's probability of the last emitted token (teacher-forced over prompt + answer with llama-cpp-python, cached in
~/.cache/specllm/bench-probs): does the model's confidence say whether it is copying? Prints, per task, "auto"
(bench.simulate's replay), the static policy without and with that split, and the oracle (bench.oracle), as
median and geometric mean over the runs' answers. Fast mode (one batch), the answers of `plain`, first turns.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import statistics
import sys
from pathlib import Path

from bench.oracle import plain_answers, replay, verify_ms
from bench.checks import fail
from bench.results_file import load_or_fail

P_BINS = (0.5, 0.9, 0.99)  # split points of the last token's probability (--probability)
MIN_SAMPLES = 5            # a group with fewer falls back to the group without the split, then drafts nothing


def bucket(match: int) -> int:
    """AutoPolicy::source_of's buckets: match lengths 1-2, 3, 4-7, 8-15, 16+."""
    return 0 if match <= 2 else 1 if match == 3 else 2 if match < 8 else 3 if match < 16 else 4


def group(match: int, doubtful: bool, boundary: int, p_last: float | None) -> tuple:
    """What the policy sees when it chooses: bucket, doubt, the sentence end's position (8 = 8 or later, -1 =
    none), and with a probability the bin it falls in."""
    g = (bucket(match), doubtful, -1 if boundary < 0 else min(boundary, 8))
    return g if p_last is None else g + (sum(p_last >= t for t in P_BINS),)


def agreeing(proposal: list[int], text: list[int], i: int) -> int:
    run = 0
    while run < len(proposal) and i + run < len(text) and proposal[run] == text[i + run]:
        run += 1
    return run


def step_view(index, prompt, text, i, k_max, boundary_of, cut, probs):
    """(group without and with the probability, proposal) at position i of the answer, or None without a match."""
    length, ambiguous, source = index.match()
    if length == 0 or k_max <= 0:
        return None
    proposal = index.lookup(k_max)[1]
    proposal = cut(proposal) if cut is not None else proposal
    last = text[i - 1] if i > 0 else prompt[-1]
    boundary = -1 if boundary_of is None or not proposal else boundary_of(last, proposal)
    doubtful = ambiguous or source >= len(prompt)
    p = None if probs is None else (probs[i - 1] if i > 0 else 1.0)
    return group(length, doubtful, boundary, None), group(length, doubtful, boundary, p), proposal


def learn(answers, boundary_of=None, cut=None) -> dict:
    """{group: [how far the proposal agreed]} over every position of every (prompt, answer, end, probs)."""
    from specllm import _core

    runs = collections.defaultdict(list)
    for prompt, answer, end, probs in answers:
        index = _core.NgramIndex(2, 4)
        index.extend(list(prompt))
        text = list(answer) + ([] if end is None else [end])
        for i in range(len(answer)):
            view = step_view(index, prompt, text, i, 48, boundary_of, cut, probs)
            if view is not None:
                plain_group, split_group, proposal = view
                run = agreeing(proposal, text, i)
                runs[plain_group].append(run)
                if split_group != plain_group:
                    runs[split_group].append(run)
            index.extend([text[i]])
    return runs


def best_k(runs: dict, groups: tuple, k_max: int, costs, row_ms: float, n_past: int, margin: float = 1.03) -> int:
    """The k with the most expected tokens per ms under the first group with MIN_SAMPLES samples (0: none pays)."""
    sample = next((runs[g] for g in groups if len(runs.get(g, ())) >= MIN_SAMPLES), None)
    if sample is None:
        return 0
    best, k_best = margin / verify_ms(costs, 1, 49, row_ms, n_past), 0
    for k in range(1, k_max + 1):
        rate = (1 + sum(min(r, k) for r in sample) / len(sample)) / verify_ms(costs, k + 1, 49, row_ms, n_past)
        if rate > best:
            best, k_best = rate, k
    return k_best


def replay_static(runs: dict, prompt, answer, end, probs, costs, row_ms: float, max_tokens: int | None,
                  boundary_of=None, cut=None) -> float:
    """Speedup over plain decoding of the static policy on one answer (drafting past its end, as the engine)."""
    from specllm import _core

    index = _core.NgramIndex(2, 4)
    index.extend(list(prompt))
    text = list(answer) + ([] if end is None else [end])
    budget = len(answer) if end is None or max_tokens is None else max(max_tokens, len(answer))
    i = ms = 0
    while i < len(answer):
        k_max = min(48, budget - i - 1)
        n_past = len(prompt) + i
        view = step_view(index, prompt, text, i, k_max, boundary_of, cut, probs)
        proposal, k = [], 0
        if view is not None:
            plain_group, split_group, proposal = view
            k = min(len(proposal), best_k(runs, (split_group, plain_group), len(proposal), costs, row_ms, n_past))
        run = agreeing(proposal[:k], text, i)
        ms += verify_ms(costs, k + 1, 49, row_ms, n_past)
        index.extend(text[i:i + run + 1])
        i += run + 1
    return len(answer) * costs[0] / ms


def probabilities(model: str, prompt: list[int], answer: list[int]) -> list[float]:
    """The target's probability of each answer token after prompt + the answer before it (cached)."""
    import numpy as np

    key = hashlib.sha1(json.dumps([os.path.abspath(model), prompt, answer]).encode()).hexdigest()[:20]
    path = Path.home() / ".cache" / "specllm" / "bench-probs" / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    global _llama
    if _llama is None or _llama.model_path != model:
        from llama_cpp import Llama

        from specllm.amx import guard_llama_cpp_python

        guard_llama_cpp_python()
        _llama = Llama(model, n_ctx=4096, n_threads=2, logits_all=True, verbose=False)
    _llama.reset()
    _llama.eval(prompt + answer)
    rows = np.array(_llama.scores[len(prompt) - 1:len(prompt) + len(answer) - 1], dtype=np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    p = np.exp(rows)
    out = [float(p[j, t] / p[j].sum()) for j, t in enumerate(answer)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, path)
    return out


_llama = None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="bench/results/*.json to replay (runs that include plain)")
    p.add_argument("--train", required=True, help="comma-separated runs whose plain answers the static policy learns")
    p.add_argument("--tasks", default="summarization,rag", help="tasks to replay (default: %(default)s)")
    p.add_argument("--probability", action="store_true",
                   help="also split the groups by the target's probability of the last emitted token")
    args = p.parse_args(argv)
    loaded = {path: load_or_fail(path, "run", system="plain", model=path == args.results[0])
              for path in args.results + args.train.split(",")}

    import specllm
    from specllm import _core
    from bench.simulate import new_policy, simulate

    tasks = set(args.tasks.split(","))

    def answers(paths):
        for path in paths:
            run = loaded[path]
            for task, prompt, answer, end in plain_answers(llm, run, set(), ends=True):
                if task in tasks:
                    probs = probabilities(run["meta"]["target"], prompt, answer) if args.probability else None
                    yield task, prompt, answer, end, probs, run["meta"].get("max_tokens")

    first = loaded[args.results[0]]["meta"]
    llm = specllm.LLM(first["target"], draft="ngram", n_threads=2, n_ctx=first.get("ctx", 4096), exact=False)
    costs, row_ms = list(llm._engine.verify_costs()), llm.profile["context_row_ms"]
    boundary_of, cut = llm._engine.target.sentence_boundary, llm._engine.target.cut_after_end
    runs = learn(((pr, a, e, pb) for _, pr, a, e, pb, _ in answers(args.train.split(","))), boundary_of, cut)
    by_task = collections.defaultdict(lambda: ([], [], [], []))
    for task, prompt, answer, end, probs, max_tokens in answers(args.results):
        index = _core.NgramIndex(2, 4)
        policy = new_policy(costs, 49, row_ms)
        policy.new_generation()
        ms, plain_ms, *_ = simulate(policy, index, prompt, answer, costs, 49, True, 48, [], row_ms, end, max_tokens,
                                    boundary_of, cut)
        oracle_ms, oracle_plain, _ = replay(index, prompt, answer, costs, 49, 48, row_ms)
        col = by_task[task]
        col[0].append(plain_ms / ms)
        col[1].append(replay_static(runs, prompt, answer, end, None, costs, row_ms, max_tokens, boundary_of, cut))
        col[2].append(replay_static(runs, prompt, answer, end, probs, costs, row_ms, max_tokens, boundary_of, cut)
                      if probs is not None else float("nan"))
        col[3].append(oracle_plain / oracle_ms)
    if not by_task:
        fail(f"no plain answers of the tasks {args.tasks} in {', '.join(args.results)}: nothing to replay")
    print(f"T(1) = {costs[0]:.0f} ms, T(16) = {costs[15]:.0f} ms, a row adds {row_ms:.4f} ms per token of context; "
          f"static policy learned on {sum(map(len, runs.values()))} positions")
    print("| task | answers | auto | static | static + probability | oracle |  (median; geometric mean)")
    print("|---|---:|---:|---:|---:|---:|")
    for task, cols in by_task.items():
        cells = [f"{statistics.median(c):.2f}; {statistics.geometric_mean(c):.3f}" if c[0] == c[0] else "–"
                 for c in cols]
        print(f"| {task} | {len(cols[0])} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
