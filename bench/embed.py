"""What an embedding costs: LLM.embed of a text of n tokens against a plain prefill of the same tokens (the prompt
processed with max_tokens=0 after reset()), interleaved per round, medians (bench/README.md as the text).

    python -m bench.embed 128 512                  # the default target, 2 threads, 3 rounds
    python -m bench.embed 128 --short 32x16        # also: 32 inputs of 16 tokens, in one call and one call each

The embedding decodes in batches of 64 rows with every row's hidden state (and, as llama.cpp computes them for
every output row, its logits), where a prefill decodes 512 rows a batch and computes the last row's logits only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.checks import positive_int


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", type=int, nargs="+", metavar="N", help="input sizes in tokens")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--short", default=None, metavar="NxT", help="N short inputs of T tokens: one call against N")
    args = ap.parse_args(argv)
    if args.rounds < 1 or min(args.sizes) < 1:
        ap.error("--rounds and the sizes must be >= 1")
    try:
        short = tuple(int(x) for x in args.short.split("x")) if args.short else None
        assert short is None or (len(short) == 2 and min(short) >= 1)
    except (ValueError, AssertionError):
        ap.error(f"--short must be NxT with N, T >= 1 (32x16), got {args.short!r}")

    import specllm

    llm = specllm.LLM(args.model, None, n_threads=args.threads, n_ctx=max(args.sizes) + 16, prompt_cache_mb=0,
                      profile_costs=False)
    text = open(os.path.join(os.path.dirname(__file__), "README.md"), encoding="utf-8").read()
    llm.embed("warm-up")  # the embedding context is made at the first call: not timed
    print("| tokens | prefill ms (median) | embed ms (median) | embed / prefill (median of rounds) |")
    print("|---|---|---|---|")
    for n in args.sizes:
        ids = llm.tokenize(text)[:n]
        times = {"prefill": [], "embed": []}
        for _ in range(args.rounds):
            llm.reset()
            t = time.perf_counter()
            llm.generate(ids, max_tokens=0)
            times["prefill"].append(time.perf_counter() - t)
            t = time.perf_counter()
            llm.embed(ids)
            times["embed"].append(time.perf_counter() - t)
        ratio = statistics.median(b / a for a, b in zip(times["prefill"], times["embed"]))
        print(f"| {len(ids)} | {1000 * statistics.median(times['prefill']):.1f} | "
              f"{1000 * statistics.median(times['embed']):.1f} | {ratio:.2f} |", flush=True)
    if short:
        n, t = short
        ids = llm.tokenize(text)
        inputs = [ids[i * t:(i + 1) * t] for i in range(n)]
        times = {"each": [], "one": []}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for x in inputs:
                llm.embed(x)
            times["each"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            llm.embed(inputs)
            times["one"].append(time.perf_counter() - t0)
        ratio = statistics.median(a / b for a, b in zip(times["each"], times["one"]))
        print("\n| inputs x tokens | one call each ms (median) | one call ms (median) | speed-up (median of rounds) |")
        print("|---|---|---|---|")
        print(f"| {n} x {t} | {1000 * statistics.median(times['each']):.1f} | "
              f"{1000 * statistics.median(times['one']):.1f} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
