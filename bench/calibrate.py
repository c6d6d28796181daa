"""How often an n-gram proposal is right, per source of the "auto" policy: the priors a new prompt starts from.

    python -m bench.calibrate bench/results/default-vs-fixed-k/2026-11-23-vm.json \\
        bench/results/copy-heavy-12-prompts/2026-11-23-vm.json bench/results/never-slower-*/2026-11-23-vm.json

Replays each plain (greedy) first-turn answer of the runs through specllm's n-gram index. At every position where
the text so far has a match, the match's source (its length bucket; clean, or doubtful: an ambiguous key or a copy
from the answer itself) gets one observation: was the proposal's next token the answer's? ("pos 0"), and, along the
proposal while it stays right, were its later tokens ("deeper")? An answer the model ended before max_tokens is
tallied with its end-of-turn token (bench.oracle.end_token), as the engine meets it: a proposal at the last step, or
one that runs past the answer's last token, is rejected there. Prints the rates per source, overall and per task.
Use the dev set's runs: the fresh set is for checking, not tuning.

Given a `bench.multicall` run, it measures the drafting memory's sources instead: each sequence's plain answers in
order, each request with the sequence's earlier answers as the memory (as bench.multicall runs them), a match
found in the memory counting for the memory's bucket (the engine takes the memory's match when it agrees further
back than the text's). The memory's priors come from

    python -m bench.calibrate bench/results/multicall-text-factor/2026-11-24-vm.json
"""
from __future__ import annotations

import argparse
import sys

from bench.oracle import plain_answers
from bench.results_file import load_or_fail

NAMES = ["clean 1-2", "clean 3", "clean 4-7", "clean 8-15", "clean 16+",
         "doubtful 1-2", "doubtful 3", "doubtful 4-7", "doubtful 8-15", "doubtful 16+",
         "memory 1-2", "memory 3", "memory 4-7", "memory 8-15", "memory 16+"]


def tally(index, prompt: list[int], answer: list[int], source_of, pos0: dict, deeper: dict, task: str = "",
          memory: list[int] = (), end: int | None = None) -> None:
    """Add one answer's observations: pos0[source] / deeper[source] / pos0[(source, task)] = [right, seen].
    `end`: the token that ended the answer (None: it was cut at max_tokens, and nothing is known past it).
    `memory`: earlier answers (each followed by the separator -1) indexed before the prompt; a match there is the
    memory's (one index over both picks the occurrence that agrees furthest back; ties go to the text), except a
    match whose key continues in more than one way, which the engine does not draft from (since 2026-11-28): the
    text's own match counts instead, as bench.simulate replays it."""
    index.clear()
    index.extend(list(memory) + list(prompt))
    text_index = type(index)(2, 4)  # the text alone, for the match that stands beside an ambiguous memory one
    text_index.extend(list(prompt))
    n_mem = len(memory)
    text = list(answer) + ([end] if end is not None else [])
    for i, token in enumerate(text):
        length, ambiguous, source = index.match()
        lookup = index.lookup
        if length > 0 and source < n_mem and ambiguous:
            length, ambiguous, source = text_index.match()
            source, lookup = source + n_mem, text_index.lookup
        if length > 0:
            from_memory = source < n_mem
            s = source_of(True, length, not from_memory and (ambiguous or source >= n_mem + len(prompt)), from_memory)
            _, proposal = lookup(8)
            for key in (s, (s, task)):
                pos0.setdefault(key, [0, 0])
                pos0[key][0] += proposal[0] == token
                pos0[key][1] += 1
            deeper.setdefault(s, [0, 0])
            for j in range(1, len(proposal)):
                if i + j >= len(text) or proposal[j - 1] != text[i + j - 1]:
                    break
                deeper[s][0] += proposal[j] == text[i + j]
                deeper[s][1] += 1
        index.push(token)
        text_index.push(token)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="bench/results/*.json of runs that include the plain system")
    args = p.parse_args(argv)
    runs = [load_or_fail(path, ("run", "multicall"), system="plain", model=i == 0)
            for i, path in enumerate(args.results)]

    import specllm
    from specllm import _core

    llm = specllm.LLM(runs[0]["meta"]["target"], draft=None, n_ctx=runs[0]["meta"].get("ctx", 4096))
    pos0: dict = {}
    deeper: dict = {}
    seen: set = set()
    index = _core.NgramIndex(2, 4)
    n_prompts = 0
    for run in runs:
        if "sequence" in run["records"][0]:  # a bench.multicall run: the memory's sources
            from bench.simulate_multicall import sequence_answers

            memory, current = [], None
            for sid, _, prompt, answer, end in sequence_answers(llm, run, ends=True):
                if sid != current:
                    memory, current = [], sid  # bench.multicall clears the memory at each sequence's start
                tally(index, prompt, answer, _core.AutoPolicy.source_of, pos0, deeper, sid, memory, end)
                memory = memory + answer + [-1]
                n_prompts += 1
            continue
        for task, prompt, answer, end in plain_answers(llm, run, seen, ends=True):
            tally(index, prompt, answer, _core.AutoPolicy.source_of, pos0, deeper, task, end=end)
            n_prompts += 1
    tasks = sorted({k[1] for k in pos0 if isinstance(k, tuple)})
    print(f"{n_prompts} answers")
    print("| source | pos 0 | seen | deeper | seen | " + " | ".join(tasks) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(tasks))
    for s, name in enumerate(NAMES, start=1):
        a, n = pos0.get(s, [0, 0])
        da, dn = deeper.get(s, [0, 0])
        cells = [f"{pos0[(s, t)][0] / pos0[(s, t)][1]:.2f} ({pos0[(s, t)][1]})" if (s, t) in pos0 else "–" for t in tasks]
        print(f"| {name} | {a / max(n, 1):.2f} | {n} | {da / max(dn, 1):.2f} | {dn} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
