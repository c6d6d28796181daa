"""Coupled vs rejection acceptance of a draft model's sampled tokens, on the real pair.

    python -m bench.acceptance                       # 2 prompts per task, T = 0.7 and 1.0, k = 4, 64 tokens

Each prompt is sampled by the target with the draft model alone (no n-gram lookup) at a fixed k, once with
coupled acceptance (the default: a seed gives plain sampling's text) and once with rejection sampling, same seeds.
Reported per temperature: drafted and accepted tokens, the acceptance rate, and tokens per target step. Acceptance
does not depend on timings, so this runs beside other work without distortion.
Results go to bench/results/acceptance/<date>-<host>.json and .md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import socket
from pathlib import Path

from bench import checks, tasks
from bench.checks import positive_int

OUT = Path(__file__).resolve().parent / "results" / "acceptance"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--limit", type=positive_int, default=2, help="prompts per task")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--k", type=positive_int, default=4)
    ap.add_argument("--max-tokens", type=positive_int, default=64)
    ap.add_argument("--seeds", type=positive_int, default=1, help="seeds per prompt")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    checks.out_dir(args.out)
    try:
        prompts = tasks.load_tasks(list(tasks.ALL_TASKS), limit=args.limit)
    except tasks.PromptError as e:
        checks.fail(str(e))

    import specllm

    llm = specllm.LLM(args.target, args.draft, ngram=False, n_threads=args.threads, profile_costs=False)
    rows = []
    for t in [float(x) for x in args.temperatures.split(",")]:
        for mode in ("coupled", "rejection"):
            drafted = accepted = steps = generated = 0
            for p in prompts:
                for seed in range(args.seeds):
                    c = llm.chat([{"role": "user", "content": p.turns[0]}], max_tokens=args.max_tokens,
                                 temperature=t, seed=seed, draft_length=args.k, acceptance=mode)
                    s = c.stats
                    drafted, accepted = drafted + s.n_drafted, accepted + s.n_accepted
                    steps, generated = steps + s.n_steps, generated + s.n_generated
            row = dict(temperature=t, acceptance=mode, prompts=len(prompts), drafted=drafted, accepted=accepted,
                       rate=round(accepted / max(1, drafted), 4), tokens_per_step=round(generated / max(1, steps), 3))
            print(row, flush=True)
            rows.append(row)
    checks.made_out_dir(args.out)
    stem = args.out / f"{datetime.date.today()}-{socket.gethostname()}"
    meta = dict(vars(args), out=str(args.out), command="python -m bench.acceptance " + " ".join(argv or []))
    checks.write_text(stem.with_suffix(".json"), json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# Coupled vs rejection acceptance ({args.target} + {args.draft}, k={args.k}, "
             f"{args.max_tokens} tokens, {len(prompts)} prompts x {args.seeds} seeds)", "",
             "| T | acceptance | drafted | accepted | rate | tokens/step |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['temperature']} | {r['acceptance']} | {r['drafted']} | {r['accepted']} | {r['rate']:.3f} | "
              f"{r['tokens_per_step']:.2f} |" for r in rows]
    checks.write_text(stem.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
