"""Where the time of a generation goes, step by step: for each speculative step the tokens drafted (k), accepted
and emitted, and its wall time; summed per request and grouped by k.

    python -m bench.steps fresh-summarization-7 holdout8-rag-2   # prompts of bench/prompts' sets (turn 1)
    python -m bench.steps json-records --max-tokens 128 --from-request 3   # a sequence of a multi-call set

One LLM with the default drafter (the --draft model, n-grams beside it, "auto", the drafting memory) runs the
prompts in order; a multi-call sequence keeps its memory across requests (a conversation resends its history, with
the LLM's own replies). A step's time is the wall time from the chunk before it to its own chunk (the first chunk,
which includes the prompt, is left out). "gain" is a k's tokens per step over its time in plain steps (the median
k = 0 step): above 1 the drafts paid on those steps. Costs move with the machine's load: compare within one run.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from dataclasses import dataclass


@dataclass
class Step:
    k: int          # tokens drafted
    accepted: int   # of them accepted
    emitted: int    # tokens the step emitted
    ms: float       # wall time since the previous chunk
    rows: int = 0   # verify rows the target decoded for it (filler rows included)
    n_past: int = 0  # tokens in the context after it


def run_steps(llm, prompt_text: str, max_tokens: int) -> tuple[str, list[Step]]:
    """(reply text, its steps after the first chunk), greedy."""
    steps, parts, t, first, rows_before = [], [], time.perf_counter(), True, 0
    with llm.stream(prompt_text, max_tokens=max_tokens, temperature=0) as stream:
        for chunk in stream:
            now, s = time.perf_counter(), llm._engine.stats
            rows = s.n_verify_rows + s.n_pad_rows
            parts.append(chunk.text)
            if not first and (chunk.tokens or chunk.n_drafted):  # not an empty closing chunk
                steps.append(Step(chunk.n_drafted, chunk.n_accepted, len(chunk.tokens), (now - t) * 1e3,
                                  rows - rows_before, s.n_prompt + s.n_generated))
            first, t, rows_before = False, now, rows
    return "".join(parts), steps


def by_k(steps: list[Step]) -> dict[int, dict]:
    """k -> {steps, accepted (mean), emitted (mean), ms (median), gain}; gain needs k = 0 steps (else None)."""
    groups = collections.defaultdict(list)
    for s in steps:
        groups[s.k].append(s)
    plain_ms = statistics.median(s.ms for s in groups[0]) if groups.get(0) else None
    out = {}
    for k in sorted(groups):
        g = groups[k]
        ms = statistics.median(s.ms for s in g)
        emitted = statistics.mean(s.emitted for s in g)
        out[k] = {"steps": len(g), "accepted": statistics.mean(s.accepted for s in g), "emitted": emitted, "ms": ms,
                  "gain": emitted / (ms / plain_ms) if plain_ms else None}
    return out


def conversations(ids: list[str]) -> list[tuple[str, object]]:
    """(name, Sequence-like) per id: a prompt's first turn (fresh.jsonl or a holdout set) is a one-request
    independent sequence."""
    from bench import multicall, tasks

    fresh = {p.id: p for path in tasks.SET_PATHS.values() for p in tasks.load_fresh(path=path)}
    known = {s.id: s for path in multicall.PROMPT_SETS.values() for s in multicall.load_sequences(path)}
    out = []
    for i in ids:
        if i in fresh:
            out.append((i, multicall.Sequence(i, "fresh", "independent", [fresh[i].turns[0]], "fresh.jsonl")))
        elif i in known:
            out.append((i, known[i]))
        else:
            raise ValueError(f"unknown prompt or sequence {i!r}: ids of the prompt sets in bench/prompts (e.g. "
                             f"fresh-rag-5, holdout8-qa-2) or of a multi-call set's sequences ({', '.join(known)})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ids", nargs="+", help="prompt ids of bench/prompts' sets and/or multi-call sequence ids")
    p.add_argument("--trace", action="store_true", help="print every step (k, accepted, emitted, rows, ms)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--from-request", type=int, default=1, help="requests of a sequence counted in the table (from)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="GGUF path, registry name or ngram")
    args = p.parse_args(argv)
    if args.max_tokens < 1 or args.from_request < 1:
        p.error("--max-tokens and --from-request must be at least 1")
    try:
        todo = conversations(args.ids)
    except ValueError as e:
        p.error(str(e))

    import specllm
    from bench.run import resolve_model

    draft = args.draft if args.draft == "ngram" else resolve_model(args.draft)
    llm = specllm.LLM(resolve_model(args.target), draft=draft, n_threads=args.threads)
    counted = []
    for name, seq in todo:
        llm.reset()  # the KV cache and the memory: each prompt or sequence starts alone
        history = []
        for n, request in enumerate(seq.requests, 1):
            messages = seq.messages(history, request)
            text, steps = run_steps(llm, llm.apply_chat_template(messages), args.max_tokens)
            if args.trace:
                for i, s in enumerate(steps):
                    print(f"  step {i}: k {s.k} accepted {s.accepted} emitted {s.emitted} rows {s.rows} "
                          f"{s.ms:.0f} ms")
            history += [{"role": "user", "content": request}, {"role": "assistant", "content": text}]
            emitted, ms = sum(s.emitted for s in steps), sum(s.ms for s in steps)
            plain = [s.ms for s in steps if s.k == 0]
            print(f"{name} request {n}: {len(steps)} steps, {emitted} tokens, {emitted / max(1, len(steps)):.2f} "
                  f"tokens/step, {ms / max(1, emitted):.1f} ms/token, k = 0 step "
                  f"{statistics.median(plain) if plain else float('nan'):.0f} ms", flush=True)
            if n >= args.from_request:
                counted += steps
    print("\n| k | steps | accepted | tokens/step | ms (median) | gain |\n|---:|---:|---:|---:|---:|---:|")
    for k, g in by_k(counted).items():
        gain = f"{g['gain']:.2f}" if g["gain"] is not None else "–"
        print(f"| {k} | {g['steps']} | {g['accepted']:.2f} | {g['emitted']:.2f} | {g['ms']:.0f} | {gain} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
