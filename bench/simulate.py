"""Replay a run's plain answers through the "auto" policy and the n-gram drafter, without the model.

    python -m bench.simulate bench/results/policy/2026-11-22-vm.json [more runs ...] [--no-doubt]

Deterministic and fast (seconds), so that policy changes can be compared on the same answers, where a timed run
on a shared 2-core machine moves by 0.1x between runs. For each task, the prompts' plain (greedy) answers are
replayed in run order through one AutoPolicy (its state carries over, as in an LLM object) and the n-gram index:
each step the policy picks k, the drafter proposes, and the draft is accepted as far as it agrees with the
answer (greedy verification of the target's own output). Time is the profiled T(n) of this machine, verify rows
in exact chunks of 7, each decoded only if reached. Prints the simulated speedup per task and the oracle's (every
step drafts exactly the agreeing tokens). It ignores what a real run adds: context growth, near-tie flips,
timing noise.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from bench.oracle import verify_ms


def simulate(policy, index, prompt: list[int], answer: list[int], costs: list[float], chunk: int, doubt: bool,
             k_limit: int):
    """-> (ms, plain ms, drafted, accepted, steps)"""
    index.clear()
    index.extend(prompt)
    i = ms = drafted = accepted = steps = 0
    while i < len(answer):
        length, ambiguous, source = index.match()
        doubtful = doubt and (ambiguous or source >= len(prompt))
        k_max = min(k_limit, len(answer) - i - 1)
        k = policy.choose(k_max, False, True, length, 1, doubtful)[0] if k_max > 0 and length > 0 else 0
        run, proposal = 0, []
        if k > 0:
            _, proposal = index.lookup(k)
            while run < len(proposal) and proposal[run] == answer[i + run]:
                run += 1
        rows = len(proposal) + 1
        reached = min(rows, -(-(run + 1) // chunk) * chunk)  # chunks after the rejecting one are skipped
        cost = verify_ms(costs, reached, chunk)
        policy.update(len(proposal), run, bool(proposal), 0.02 * len(proposal), cost, 0, reached)
        if not proposal and length > 0:  # as the engine: would the proposal's first token have been right?
            _, first = index.lookup(1)
            policy.observe_shadow(length, doubtful, first[0] == answer[i])
        ms += cost
        drafted += len(proposal)
        accepted += run
        steps += 1
        index.extend(answer[i:i + run + 1])
        i += run + 1
    return ms, len(answer) * costs[0], drafted, accepted, steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="bench/results/*.json of runs that include the plain system")
    p.add_argument("--threads", type=int, default=2, help="threads of the cost profile (default: 2)")
    p.add_argument("--no-doubt", action="store_true", help="treat every n-gram match as clean")
    p.add_argument("--one-policy", action="store_true",
                   help="one policy for all tasks in order (as one LLM object serves them in a bench run)")
    p.add_argument("--carry", type=int, default=None,
                   help="observations per source and position a new prompt carries over (default: the engine's)")
    p.add_argument("--keep", type=float, default=None,
                   help="share of what was learned (over the prior) a new prompt keeps (default: the engine's)")
    p.add_argument("--fast", action="store_true", help="costs of exact=False (llama.cpp's batch kernels, one batch)")
    p.add_argument("--answers", default="plain",
                   help="whose answers to replay (default: %(default)s; e.g. hybrid: the default's own answers, "
                        "which differ from plain's in fast mode)")
    args = p.parse_args(argv)

    import specllm
    from specllm import _core
    from bench.oracle import plain_answers, replay

    llm = None
    answers: dict[str, list] = {}  # task -> [(prompt tokens, answer tokens)] in run order
    seen: set = set()
    for path in args.results:
        with open(path) as f:
            run = json.load(f)
        if llm is None:
            meta = run["meta"]
            llm = specllm.LLM(meta["target"], draft="ngram", n_threads=args.threads, n_ctx=meta.get("ctx", 4096),
                              exact=not args.fast)
        for task, prompt, answer in plain_answers(llm, run, seen, args.answers):
            answers.setdefault(task, []).append((prompt, answer))
    costs = list(llm._engine.verify_costs())
    chunk = _core.AutoPolicy.n_max + 1 if args.fast else _core.exact_verify_rows
    print(f"T(1..8) = {', '.join(f'{c:.0f}' for c in costs[:8])}, T(16) = {costs[15]:.0f}, T(32) = {costs[31]:.0f} ms; "
          f"verify chunks of {chunk} rows")
    print("| task | prompts | policy (median) | oracle (median) | drafted | accepted | steps/token |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    index = _core.NgramIndex(2, 4)
    carry_over = {k: v for k, v in (("carry", args.carry), ("keep", args.keep)) if v is not None}
    policy = None
    for task, pairs in answers.items():
        if policy is None or not args.one_policy:
            policy = _core.AutoPolicy()
            policy.set_verify_costs(costs)
            policy.set_verify_rows(chunk)
        sims, oracles, tot = [], [], [0, 0, 0, 0]
        for prompt, answer in pairs:
            policy.new_generation(**carry_over)  # as Engine::start
            ms, plain_ms, d, a, s = simulate(policy, index, prompt, answer, costs, chunk, not args.no_doubt,
                                             _core.AutoPolicy.n_max)
            sims.append(plain_ms / ms)
            oms, oplain, _ = replay(index, prompt, answer, costs, chunk, _core.AutoPolicy.n_max)
            oracles.append(oplain / oms)
            for j, v in enumerate((d, a, s, len(answer))):
                tot[j] += v
        print(f"| {task} | {len(pairs)} | {statistics.median(sims):.2f} | {statistics.median(oracles):.2f} | "
              f"{tot[0]} | {tot[1]} ({tot[1] / max(1, tot[0]):.0%}) | {tot[2] / tot[3]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
