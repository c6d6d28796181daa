"""What the context adds to a verify batch on this machine: T(n) at several contexts, and how well the profile's
context term (profile.context_row_cost) describes it.

    python -m bench.context_costs --rounds 2 --repeat 6       # ~10 min on a 2-core CPU, 4k context

For each round and context c, Engine.profile_verify times every size beside a 1-row step (T(n) = the least T(1) x
the median of the pairs' T(n) / T(1)). The table gives T(1) at c over T(1) at 32 (the plain step's rise, which
the level the policy learns from the steps takes in) and, per n, what the rows add beyond that rise in ms per row
per token ((T(n, c) / T(1, c) - T(n, 32) / T(1, 32)) x T(1, 32) / ((n - 1) (c - 32)), the policy's context_row_ms): about 0
where a batch's cost grows with the context as a plain step's does. Then `--repeat` measurements of the term as a
load measures it, to show its spread. Costs move with the machine's load: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from bench.checks import positive_int

SIZES = [1, 2, 3, 4, 5, 6, 8, 12, 16]
CONTEXTS = [32, 512, 1024, 2048, 3072]


def rows_term(t: dict, c: int, n: int) -> float:
    """ms per row per token that n rows add at context c beyond the plain step's rise (t[c][n]: T(n) at c)."""
    from specllm.profile import rows_term as term

    return term(t[32][1], t[32][1], t[32][n], t[c][1], t[c][n], n, c)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=2, help="rounds over all contexts (medians are taken)")
    p.add_argument("--repeat", type=positive_int, default=6, help="measurements of profile.context_row_cost afterwards")
    p.add_argument("--out", default=None, help="write the measurements to this JSON file")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.repeat < 0 or args.threads < 1:
        p.error("--rounds and --threads must be at least 1, --repeat at least 0")

    import specllm
    from specllm import profile
    from bench.run import resolve_model

    llm = specllm.LLM(resolve_model(args.target), draft=None, n_threads=args.threads, n_ctx=max(CONTEXTS) + 64)
    engine = llm._engine
    measured = []
    for r in range(args.rounds):
        for c in CONTEXTS:
            ms = engine.profile_verify(SIZES, 2, c)
            measured.append({"round": r, "context": c, "ms": {n: ms[n - 1] for n in SIZES}})
            print(f"round {r}, {c} tokens: " + ", ".join(f"T({n}) {ms[n - 1]:.0f}" for n in SIZES), flush=True)
    t = {c: {n: statistics.median(m["ms"][n] for m in measured if m["context"] == c) for n in SIZES}
         for c in CONTEXTS}
    print("\n| context | T(1) / T(1) at 32 | " + " | ".join(f"rows' term n={n}" for n in SIZES[1:]) + " |")
    print("|---:|---:|" + "---:|" * (len(SIZES) - 1))
    for c in CONTEXTS[1:]:
        print(f"| {c} | {t[c][1] / t[32][1]:.3f} | " +
              " | ".join(f"{rows_term(t, c, n):+.4f}" for n in SIZES[1:]) + " |")
    terms = []
    if args.repeat:
        verify_ms = engine.profile_verify(profile.SIZES, profile.N_REPS)
        print(f"\nprofile.context_row_cost, {args.repeat} times (T(1) = {verify_ms[0]:.1f} ms):")
        for _ in range(args.repeat):
            terms.append(profile.context_row_cost(engine, profile.SIZES, verify_ms))
            print(f"  context_row_ms {terms[-1]:.4f}", flush=True)
        print(f"context_row_ms: median {statistics.median(terms):.4f}, range {min(terms):.4f}-{max(terms):.4f}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")  # whole or not at all
        tmp.write_text(json.dumps({"target": llm.model_path, "threads": args.threads, "grid": measured,
                                   "context_row_ms": terms}, indent=1))
        os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
