"""Where the spread of a prompt's speed-up between separate runs comes from: the policy's decisions, or the clock.

    python -m bench.spread record --prompts holdout --limit 2 --out /tmp/spread-1.json   # once per process, N times
    python -m bench.spread compare /tmp/spread-*.json

`record` runs the default LLM (the --draft model, n-grams, "auto", the drafting memory) over a prompt set in the
order bench.run uses, in one process, as a server would (the memory of earlier prompts kept, the KV cache not), and
keeps every step: tokens drafted, accepted, emitted, the verify rows decoded and its wall time. `compare` costs each
step with the recorded profile's T(rows) (plus what the rows add with the context), never with the clock:
n_generated x T(1) / sum of T(rows) is the speed-up the decisions and the text give on this machine's profile. Runs in
separate processes that differ there differ by what the policy did (learned from the timing of earlier steps, from
the memory, from a text that came out otherwise: in fast mode a near-tie can flip with the batch); what a timed run
shows beyond that is the machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import checks, tasks
from bench.checks import positive_int


def record(llm, template, prompts, max_tokens: int) -> dict:
    """{"profile": llm.profile, "prompts": {id: [{"text", "steps": [[k, accepted, emitted, rows, ms, n_past]]}]}}"""
    from bench.steps import run_steps

    out = {"profile": llm.profile, "prompts": {}}
    for p in prompts:
        llm.reset(keep_memory=True)
        messages, turns = [], []
        for user in p.turns:
            messages.append({"role": "user", "content": user})
            text, steps = run_steps(llm, template(messages), max_tokens)
            turns.append({"text": text, "steps": [[s.k, s.accepted, s.emitted, s.rows, round(s.ms, 2), s.n_past]
                                                  for s in steps]})
            messages.append({"role": "assistant", "content": text})
        out["prompts"][p.id] = turns
        print(p.id, [len(t["steps"]) for t in turns], file=sys.stderr, flush=True)
    return out


def step_ms(profile: dict, rows: int, n_past: int) -> float:
    """T(rows) of the profile (the cheapest measured size at least as large; past the last, linear) plus the
    context's share, as the policy costs a batch."""
    costs = [(n, ms) for n, ms in enumerate(profile["verify_ms"], 1) if ms > 0]
    at_least = [ms for n, ms in costs if n >= rows]
    base = min(at_least) if at_least else costs[-1][1] * rows / costs[-1][0]
    return base + profile.get("context_row_ms", 0.0) * max(0, rows - 1) * max(0, n_past - 32)


def modelled_speedup(profile: dict, steps: list) -> float:
    t1 = profile["verify_ms"][0]
    n = sum(s[2] for s in steps)
    ms = sum(step_ms(profile, max(1, s[3]), s[5]) for s in steps)
    return n * t1 / ms if ms > 0 else 0.0


def compare(runs: list[dict]) -> list[dict]:
    """Per (prompt, turn): each run's modelled speed-up, drafted, accepted, steps, and how many runs wrote the first
    run's text."""
    rows = []
    for pid, turns in runs[0]["prompts"].items():
        for turn in range(len(turns)):
            got = [r["prompts"][pid][turn] for r in runs if pid in r["prompts"]]
            rows.append({"id": pid, "turn": turn,
                         "speedup": [modelled_speedup(r["profile"], g["steps"]) for r, g in zip(runs, got)],
                         "drafted": [sum(s[0] for s in g["steps"]) for g in got],
                         "accepted": [sum(s[1] for s in g["steps"]) for g in got],
                         "steps": [len(g["steps"]) for g in got],
                         "same_text": sum(g["text"] == got[0]["text"] for g in got)})
    return rows


def print_compare(rows: list[dict], n_runs: int) -> None:
    print("| prompt | turn | modelled speed-up per run | range | drafted | accepted | steps | same text |")
    print("|---|---:|---|---:|---|---|---|---:|")
    for r in rows:
        sp = r["speedup"]
        print(f"| {r['id']} | {r['turn']} | {' '.join(f'{x:.2f}' for x in sp)} | {max(sp) - min(sp):.2f} | "
              f"{r['drafted']} | {r['accepted']} | {r['steps']} | {r['same_text']}/{n_runs} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spread", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the default over a prompt set in this process and keep every step")
    rec.add_argument("--prompts", choices=tasks.PROMPT_SETS, default="holdout", help="prompt set")
    rec.add_argument("--limit", type=positive_int, default=2, help="prompts per task")
    rec.add_argument("--max-tokens", type=positive_int, default=96)
    rec.add_argument("--threads", type=positive_int, default=2)
    rec.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    rec.add_argument("--draft", default="qwen2.5-coder-0.5b", help="GGUF path, registry name or ngram")
    rec.add_argument("--out", required=True)
    cmp_ = sub.add_parser("compare", help="compare recorded runs, costed with their profile")
    cmp_.add_argument("runs", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "compare":
        from bench.results_file import load_or_fail

        runs = [load_or_fail(path, "spread") for path in args.runs]
        print_compare(compare(runs), len(runs))
        return 0
    from bench import run as bench_run
    from bench.systems import Config, SpecllmSystem

    if Path(args.out).is_dir():
        checks.fail(f"--out {args.out} is a folder: give the path of the .json file to write")
    checks.out_dir(Path(args.out).parent)
    try:
        prompts = tasks.load_tasks(list(tasks.ALL_TASKS), limit=args.limit, prompt_set=args.prompts)
    except tasks.PromptError as e:
        checks.fail(str(e))
    cfg = Config(target=bench_run.resolve_model(args.target),
                 draft=args.draft if args.draft == "ngram" else bench_run.resolve_model(args.draft, "--draft"),
                 n_threads=args.threads)
    system = SpecllmSystem("hybrid", cfg)
    system.load()
    template = bench_run.make_templater([system], cfg.target)
    bench_run.warm_up([system], template, [])
    result = record(system.llm, template, prompts, args.max_tokens)
    checks.made_out_dir(Path(args.out).parent)
    checks.write_text(Path(args.out), json.dumps(result))  # never a half-written file
    return 0


if __name__ == "__main__":
    sys.exit(main())
