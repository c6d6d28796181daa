"""What the drafting machinery costs a step when it proposes nothing: one LLM (the default pair), each prompt
generated with draft_length=0 (the engine then skips the n-gram lookups, shadow checks and the policy) and with
"auto", the order alternated per round — the same weights in the same place, so no load-place bias. The pairs where
"auto" drafted nothing give the machinery's cost; the others are listed too.

    SPECLLM_PROFILES=DIR python -m bench.draft_overhead --rounds 4 --tasks translation,qa,math_reasoning
"""
from __future__ import annotations

import argparse
import statistics as st
import sys

from bench.checks import fail, names_in, positive_int
from bench.tasks import ALL_TASKS, SET_PATHS, PromptError, read_jsonl


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.draft_overhead", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="registry name or GGUF path (its default draft)")
    p.add_argument("--prompts", default="holdout3", choices=SET_PATHS,
                   help="bench/prompts/NAME.jsonl (default: %(default)s)")
    p.add_argument("--tasks", default="translation,qa,math_reasoning", help="comma-separated tasks")
    p.add_argument("--rounds", type=positive_int, default=4)
    p.add_argument("--max-tokens", type=positive_int, default=96)
    p.add_argument("--threads", type=positive_int, default=2)
    args = p.parse_args(argv)
    tasks = set(names_in(p, "--tasks", args.tasks, ALL_TASKS))
    try:
        rows = read_jsonl(SET_PATHS[args.prompts], ("task", "turns"), "prompts")
    except PromptError as e:
        fail(str(e))
    rows = [r for r in rows if r["task"] in tasks]
    if not rows:
        p.error(f"no prompts of the tasks {args.tasks} in --prompts {args.prompts}")
    import specllm

    llm = specllm.LLM(args.model, n_threads=args.threads)
    idle, drafted = [], []
    for rep in range(args.rounds):
        for r in rows:
            messages = [{"role": "user", "content": r["turns"][0]}]
            stats = {}
            for mode in (["auto", 0] if rep % 2 == 0 else [0, "auto"]):
                llm.reset()
                stats[mode] = llm.chat(messages, max_tokens=args.max_tokens, temperature=0.0, draft_length=mode).stats
            a, z = stats["auto"], stats[0]
            ratio = a.tokens_per_second / z.tokens_per_second
            (idle if a.n_drafted == 0 else drafted).append(ratio)
            print(f"round {rep + 1} {r['id']}: auto drafted {a.n_drafted} in {a.n_steps} steps (draft_length=0: "
                  f"{z.n_steps}); auto / draft_length=0 {ratio:.3f}", flush=True)
    for name, values in (("auto drafted nothing", idle), ("auto drafted", drafted)):
        if values:
            print(f"{name}: {len(values)} pairs, median ratio {st.median(values):.4f} "
                  f"(range {min(values):.3f}-{max(values):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
