"""How far the verify-cost profile's shape moves on this machine: within one load and between loads.

    python -m bench.profile_spread --loads 4 --times 4       # ~2 min on a 2-core CPU

Each load is a process of its own (as a user's separate runs are); in it, Engine.profile_verify times the sizes
--times times in a row with the rounds a load's profile uses (profile.N_REPS). Prints T(1) and T(n) / T(1) per
measurement, then the spread of T(2) / T(1) and T(8) / T(1) within each load and over all of them. Where the
spread within a load is as wide as between loads, a profile's shape is a sample of the machine's moment, and a
prompt's speed-up moves with whichever moment the load caught (bench/README, "Between runs: the profile or the
machine"). Run it on an otherwise quiet machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from bench.checks import positive_int

SIZES = [1, 2, 3, 4, 6, 8, 12, 16]


def one_load(target: str, threads: int, times: int, rounds: int) -> list:
    """[T(1..max)] per measurement, in this process (one load)."""
    import specllm
    from specllm import profile

    llm = specllm.LLM(target, draft=None, n_threads=threads, n_ctx=512, profile_costs=False)
    try:
        return [llm._engine.profile_verify(SIZES, rounds or profile.N_REPS) for _ in range(times)]
    finally:
        llm.close()


def spread(values: list) -> str:
    return f"{min(values):.2f}-{max(values):.2f} (median {statistics.median(values):.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_spread", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--loads", type=positive_int, default=4, help="processes, each one load")
    p.add_argument("--times", type=positive_int, default=4, help="measurements in each load")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help="rounds each measurement times (default: a load's, profile.N_REPS)")
    p.add_argument("--one-load", action="store_true", help=argparse.SUPPRESS)  # a child: print JSON, nothing else
    args = p.parse_args(argv)
    from bench.run import resolve_model

    target = resolve_model(args.target)
    if args.one_load:
        print(json.dumps(one_load(target, args.threads, args.times, args.rounds)))
        return 0
    loads = []
    for i in range(args.loads):
        r = subprocess.run([sys.executable, "-m", "bench.profile_spread", "--one-load", "--target", target,
                            "--threads", str(args.threads), "--times", str(args.times)]
                           + (["--rounds", str(args.rounds)] if args.rounds else []),
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            print(f"error: load {i + 1} failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        loads.append(json.loads(r.stdout.strip().splitlines()[-1]))
        for ms in loads[-1]:
            print(f"load {i + 1}: T(1) {ms[0]:.1f} ms, T(n)/T(1) " +
                  " ".join(f"{n}:{ms[n - 1] / ms[0]:.2f}" for n in SIZES[1:]), flush=True)
    for n in (2, 8):
        within = [spread([ms[n - 1] / ms[0] for ms in load]) for load in loads]
        every = [ms[n - 1] / ms[0] for load in loads for ms in load]
        print(f"T({n})/T(1): within each load " + "; ".join(within) + f"; over all {spread(every)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
