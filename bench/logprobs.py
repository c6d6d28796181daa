"""What asking for logprobs costs: the same chat replies with and without `logprobs=n`, interleaved per round.

    python -m bench.logprobs                       # the default pair, plain and default drafting, 3 rounds
    python -m bench.logprobs --rounds 5 --max-tokens 96
    python -m bench.logprobs --scoring 128 512     # prompt_logprobs: scoring prompts of 128 and 512 tokens

Reported with --scoring: the time to process a prompt of n tokens (max_tokens=0, after reset()) with
prompt_logprobs=1 over the time without, interleaved per round, medians (this README's text as the prompt).

Reported per system and n: the extra time per generated token (the engine's verification arithmetic, where the
log-softmax over the vocabulary runs: stats.sample_ms with logprobs minus without) and the generation's wall-time
ratio (with / without), medians over the rounds and prompts.
"""
from __future__ import annotations

import argparse
import statistics

from bench.checks import positive_int

PROMPTS = [
    "Write a haiku about the sea.",
    "Add type hints and a docstring to this function:\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n"
    "        total += x\n    return total / len(xs)\n",
]


def main(argv=None) -> None:
    import specllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--max-tokens", type=positive_int, default=64)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--top", type=int, nargs="+", default=[0, 5, 20], help="the logprobs=n values")
    ap.add_argument("--scoring", type=int, nargs="+", metavar="N", help="prompt sizes: time prompt_logprobs instead")
    args = ap.parse_args(argv)
    if args.scoring:
        return scoring(args)
    systems = {"plain": specllm.LLM(args.model, None, n_threads=args.threads, n_ctx=2048),
               "default": specllm.LLM(args.model, n_threads=args.threads, n_ctx=2048)}
    extra = {(s, n): [] for s in systems for n in args.top}
    ratio = {(s, n): [] for s in systems for n in args.top}
    for _ in range(args.rounds):
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            for name, llm in systems.items():
                for n in args.top:
                    base = llm.chat(messages, max_tokens=args.max_tokens)
                    with_lp = llm.chat(messages, max_tokens=args.max_tokens, logprobs=n)
                    extra[name, n].append((with_lp.stats.sample_ms - base.stats.sample_ms) / with_lp.stats.n_generated)
                    ratio[name, n].append(with_lp.stats.generate_ms / base.stats.generate_ms)
    print("| system | logprobs | extra ms per token (median) | wall time with / without (median) |")
    print("|---|---|---|---|")
    for (name, n), v in extra.items():
        print(f"| {name} | {n} | {statistics.median(v):.2f} | {statistics.median(ratio[name, n]):.3f} |")


def scoring(args) -> None:
    import os
    import time

    import specllm

    llm = specllm.LLM(args.model, None, n_threads=args.threads, n_ctx=max(args.scoring) + 16)
    text = open(os.path.join(os.path.dirname(__file__), "README.md"), encoding="utf-8").read()
    print("| prompt tokens | prefill ms (median) | scored ms (median) | scored / prefill (median of rounds) |")
    print("|---|---|---|---|")
    for n in args.scoring:
        ids = llm.tokenize(text)[:n]
        times = {False: [], True: []}
        for _ in range(args.rounds):
            for scored in (False, True):
                llm.reset()
                t = time.perf_counter()
                llm.generate(ids, max_tokens=0, prompt_logprobs=1 if scored else None)
                times[scored].append(time.perf_counter() - t)
        ratio = statistics.median(b / a for a, b in zip(times[False], times[True]))
        print(f"| {len(ids)} | {1000 * statistics.median(times[False]):.1f} | "
              f"{1000 * statistics.median(times[True]):.1f} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
