"""What a quantized KV cache saves and changes: the bytes a token takes in the target's and the draft model's cache,
and how far greedy plain decoding with it follows f16's, per cache type (bench/README.md, "KV cache types"). Speed
is bench.run's job: its systems plain-q8, hybrid-q8, plain-q4, hybrid-q4 and llama.cpp-q8.

    python -m bench.kv_cache                                  # the first prompt of every task, 2 per task below
    python -m bench.kv_cache --types f16,q8_0,q8_0/q4_0 --limit 2 --prompts holdout4
    python -m bench.kv_cache --types f16,q8_0 --long 1000,3000,7000   # generation speed at long contexts

A prompt's first turn is chat-templated and answered greedily by plain decoding, max-tokens tokens, with each cache
("q8_0": K and V q8_0; "q8_0/q4_0": K q8_0, V q4_0; flash attention on, llama.cpp's choice on a CPU). "same" counts the answers equal to f16's; "first
difference" is the median token where an answer leaves f16's (an equal answer counts its length).

--long C1,C2,...: plain decoding's speed at contexts of C tokens (the start of bench/README.md), each cache its own
LLM, the prompt decoded once (timed) and then --rounds times 32 tokens from the cached prompt, the caches in turn
(rotated each round); the ratio to f16 is the median of the rounds'.
"""
from __future__ import annotations

import argparse
import statistics

from bench import tasks
from bench.checks import names_in, positive_int


def first_difference(a: list, b: list) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f16,q8_0,q8_0/q4_0,q4_0",
                    help="caches, f16 first: a type for K and V, or K/V (default: %(default)s)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", choices=tasks.PROMPT_SETS, default="holdout5")
    ap.add_argument("--tasks", default=",".join(tasks.ALL_TASKS))
    ap.add_argument("--limit", type=positive_int, default=1, help="prompts per task (default: %(default)s)")
    ap.add_argument("--max-tokens", type=positive_int, default=128)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--long", default=None, metavar="C1,C2", help="generation speed at these contexts instead")
    ap.add_argument("--rounds", type=positive_int, default=5, help="rounds of --long (default: %(default)s)")
    args = ap.parse_args(argv)
    types = args.types.split(",")
    from specllm.options import CACHE_TYPES

    pairs = {t: (t.split("/") * 2)[:2] if t.count("/") < 2 else [] for t in types}
    if types[0] != "f16" or len(set(types)) != len(types) or not all(
            len(kv) == 2 and set(kv) <= set(CACHE_TYPES) for kv in pairs.values()):
        ap.error(f"--types must start with f16 and name each cache once, as a type or K/V of {', '.join(CACHE_TYPES)}")
    try:
        contexts = [int(c) for c in args.long.split(",")] if args.long else []
    except ValueError:
        ap.error(f"--long must be token counts separated by commas, got {args.long!r}")
    if contexts and min(contexts) < 1:
        ap.error("--long's contexts must be >= 1")

    task_names = names_in(ap, "--tasks", args.tasks, tasks.ALL_TASKS)
    prompts = [] if contexts else tasks.load_tasks(task_names, args.limit, prompt_set=args.prompts)
    if not contexts and not prompts:
        ap.error(f"no prompts of the tasks {args.tasks} in --prompts {args.prompts}")

    import specllm

    if contexts:
        return long_contexts(specllm, args, types, pairs, contexts)

    answers, sizes, contexts = {}, {}, []
    for t in types:
        kv = dict(cache_type_k=pairs[t][0], cache_type_v=pairs[t][1], n_ctx=args.ctx, n_threads=args.threads, profile_costs=False,
                  prompt_cache_mb=0, memory_tokens=0)
        with specllm.LLM(args.target, args.draft, **kv) as pair:
            pair.generate(pair.apply_chat_template([{"role": "user", "content": prompts[0].turns[0]}]), max_tokens=8,
                          draft_length=4)
            target, draft = pair._engine.target, pair._engine.draft
            sizes[t] = (target.state_size / target.n_past, draft.state_size / draft.n_past)
        with specllm.LLM(args.target, None, **kv) as plain:
            answers[t] = []
            for p in prompts:
                ids = plain.tokenize(plain.apply_chat_template([{"role": "user", "content": p.turns[0]}]))
                if t == types[0]:
                    contexts.append(len(ids))
                answers[t].append(plain.generate(ids, max_tokens=args.max_tokens).tokens)
                plain.reset()

    print(f"| cache (K/V) | target KiB a token | draft KiB a token | target MiB at {args.ctx} tokens | "
          f"answers equal to f16's | first difference (median token) |")
    print("|---|---|---|---|---|---|")
    for t in types:
        same = sum(a == b for a, b in zip(answers[t], answers[types[0]]))
        first = statistics.median(first_difference(a, b) for a, b in zip(answers[t], answers[types[0]]))
        print(f"| {t} | {sizes[t][0] / 1024:.2f} | {sizes[t][1] / 1024:.2f} | {sizes[t][0] * args.ctx / 2**20:.0f} | "
              f"{same} of {len(prompts)} | {first:g} |", flush=True)
    print(f"\n{len(prompts)} prompts ({args.prompts}: {args.tasks}), {statistics.median(contexts):g} prompt tokens "
          f"(median), greedy, {args.max_tokens} tokens")


def long_contexts(specllm, args, types, pairs, contexts) -> None:
    text = open(__file__.rsplit("/", 1)[0] + "/README.md", encoding="utf-8").read()
    print("| context | cache (K/V) | prompt s | tok/s at the context (median) | / f16 (median of rounds) |")
    print("|---|---|---|---|---|")
    for c in contexts:
        llms, prompt_s, tps = {}, {}, {t: [] for t in types}
        try:
            for t in types:
                llms[t] = specllm.LLM(args.target, None, cache_type_k=pairs[t][0], cache_type_v=pairs[t][1],
                                      n_ctx=c + 64, n_threads=args.threads, profile_costs=False, prompt_cache_mb=0,
                                      memory_tokens=0)
                ids = llms[t].tokenize(text * (1 + 4 * c // max(len(text), 1)))[:c]
                prompt_s[t] = llms[t].generate(ids, max_tokens=0).stats.prefill_ms / 1000
            for r in range(args.rounds):
                for t in types[r % len(types):] + types[:r % len(types)]:
                    tps[t].append(llms[t].generate(ids, max_tokens=32).stats.tokens_per_second)
        finally:
            for llm in llms.values():
                llm.close()
        for t in types:
            ratio = statistics.median(a / b for a, b in zip(tps[t], tps[types[0]]))
            print(f"| {c} | {t} | {prompt_s[t]:.1f} | {statistics.median(tps[t]):.2f} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
