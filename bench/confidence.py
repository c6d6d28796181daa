"""The target's probability of each token of a run's plain answers (teacher-forced), and what it says of n-gram drafts.

    python -m bench.confidence bench/results/default-vs-fixed-k/2026-11-23-vm.json [more runs ...] --out conf.json

For every plain first-turn answer of the runs, the target evaluates prompt + answer in one pass (llama-cpp-python's
Llama with logits for every row) and keeps softmax(row)[token] for each answer token. The file maps
answer_key(prompt, answer) to that list; `python -m bench.simulate RUN.json --confidence conf.json` tells the policy
the probability of the token before each step, as the engine does. Prints, over the positions where the text so far
has an n-gram match (as bench.calibrate finds them), how often the proposal's next token was right against what its
source's prior expected, by the probability of the token before it: the table behind
AutoPolicy::confidence_factor. Use the dev set's runs: the fresh sets are for checking, not tuning.
"""
from __future__ import annotations

import argparse
import json
import sys

EDGES = (0.5, 0.8, 0.9, 0.95, 0.99, 1.01)


def answer_key(prompt: list[int], answer: list[int]) -> str:
    return json.dumps([list(prompt[-64:]), list(answer[:64])])


def token_probabilities(llama, prompt: list[int], answer: list[int]) -> list[float]:
    import numpy as np

    llama.reset()
    llama.eval(list(prompt) + list(answer))
    rows = np.asarray(llama.scores[len(prompt) - 1: len(prompt) - 1 + len(answer)], dtype=np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    p = np.exp(rows)
    p /= p.sum(axis=1, keepdims=True)
    return [float(p[i, t]) for i, t in enumerate(answer)]


def tally(index, prompt, answer, end, probs, source_of, prior, table) -> None:
    """table[edge] = [right, expected] over the positions with a match in the text (not the first)."""
    index.clear()
    index.extend(list(prompt))
    text = list(answer) + ([end] if end is not None else [])
    for i, token in enumerate(text):
        length, ambiguous, source = index.match()
        if length > 0 and i > 0:
            _, proposal = index.lookup(1)
            s = source_of(True, length, ambiguous or source >= len(prompt), False)
            edge = next(e for e in EDGES if probs[i - 1] < e)
            table.setdefault(edge, [0.0, 0.0, 0])
            table[edge][0] += proposal[0] == token
            table[edge][1] += prior[s]
            table[edge][2] += 1
        index.push(token)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="bench/results/*.json of runs that include the plain system")
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import specllm
    from llama_cpp import Llama
    from specllm import _core

    from bench.oracle import plain_answers

    runs = [json.load(open(path)) for path in args.results]
    target = runs[0]["meta"]["target"]
    tok = specllm.LLM(target, draft=None, n_ctx=4096, n_threads=args.threads)
    llama = Llama(target, n_ctx=4096, logits_all=True, n_threads=args.threads, verbose=False)
    policy = _core.AutoPolicy()
    prior = {s: policy.acceptance(s)[0] for s in range(1, _core.AutoPolicy.n_sources)}
    index = _core.NgramIndex(2, 4)
    out, seen, table = {}, set(), {}
    for run in runs:
        for _, prompt, answer, end in plain_answers(tok, run, seen, ends=True):
            probs = token_probabilities(llama, prompt, answer)
            out[answer_key(prompt, answer)] = probs
            tally(index, prompt, answer, end, probs, _core.AutoPolicy.source_of, prior, table)
    tmp = args.out + ".partial"
    with open(tmp, "w") as f:
        json.dump(out, f)
    import os

    os.replace(tmp, args.out)
    print(f"{len(out)} answers -> {args.out}")
    print("| p(token before) below | positions | right / expected by the source's prior |")
    print("|---:|---:|---:|")
    for e in EDGES:
        if e in table:
            right, expected, n = table[e]
            print(f"| {min(e, 1.0):.2f} | {n} | {right / expected:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
