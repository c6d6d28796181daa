"""Upper bound of n-gram drafting on a benchmark run: how fast could an oracle policy have been?

    python -m bench.oracle bench/results/policy/2026-11-22-vm.json

For each prompt's plain (greedy) answer of the run, replays the answer through specllm's n-gram index; at every
step an oracle drafts exactly the proposal tokens that the answer continues with (none when the first is wrong),
so it never pays for a rejected token. Its time uses the target's verify costs T(n) from specllm's profile of
this machine (exact mode: chunks of at most 3 rows). Prints, per task, the oracle's speedup over plain decoding
and the fraction of answer tokens that came from drafts. A bar above the oracle cannot be reached by any draft
length policy with this drafter on this machine. First turns only.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from bench import checks, tasks
from bench.results_file import load_or_fail


def verify_ms(costs: list[float], rows: int, chunk: int, row_ms: float = 0.0, n_past: int = 0) -> float:
    """ms to verify `rows` rows in chunks of at most `chunk`, each chunk also paying what the context adds."""
    return sum(costs[min(chunk, rows - r0) - 1] + context_ms(row_ms, min(chunk, rows - r0), n_past)
               for r0 in range(0, rows, chunk))


PROFILE_CONTEXT = 32  # the context the profile measures T(n) at


def context_ms(row_ms: float, rows: int, n_past: int) -> float:
    """What the context adds to a batch of `rows` verify rows (the engine's cost model, AutoPolicy::context_extra):
    `row_ms` per row after the first per token of context beyond the profile's."""
    return row_ms * max(0, rows - 1) * max(0, n_past - PROFILE_CONTEXT)


def chat_template_of(meta: dict) -> str:
    """The chat_template= that renders a run's prompts as it was run: the model's Jinja template since bench records
    meta["chat_template"] = "jinja" (2026-11-26), llama.cpp's built-in formatting of it before (without Qwen's
    default system message)."""
    from specllm.chat_template import LLAMA_CPP

    return "" if meta.get("chat_template") == "jinja" else LLAMA_CPP


def plain_answers(llm, run: dict, seen: set | None = None, system: str = "plain", ends: bool = False):
    """(task, prompt tokens, answer tokens) of a run's plain first-turn answers (or another system's), in run order
    (a (task, id) in `seen` is skipped, and added). ends=True: a fourth item, the token that ended the answer (the
    template's end of turn) if the model ended it before max_tokens, else None (cut at max_tokens)."""
    meta = run["meta"]
    try:
        prompts = {(q.task, q.id): q for q in tasks.load_tasks(str(meta["tasks"]).split(","), meta.get("limit"),
                                                                prompt_set=meta.get("prompts", "dev"),
                                                                skip=meta.get("skip") or 0)}
    except (tasks.PromptError, TypeError, ValueError) as e:
        checks.fail(f"cannot read the prompts the run used (meta.tasks {meta['tasks']!r}): {e}")
    seen = set() if seen is None else seen
    for rec in run["records"]:
        key = (rec["task"], rec["id"])
        if rec["system"] != system or rec["turn"] != 0 or key not in prompts or key in seen:
            continue
        seen.add(key)
        text = llm.apply_chat_template([{"role": "user", "content": prompts[key].turns[0]}], add_generation_prompt=True,
                                       chat_template=chat_template_of(meta))
        answer = llm.tokenize(rec["text"], add_special=False)
        if answer:
            prompt = llm.tokenize(text)
            if ends:
                yield rec["task"], prompt, answer, end_token(llm, prompt, rec.get("n_gen"), meta.get("max_tokens"))
            else:
                yield rec["task"], prompt, answer


def end_token(llm, prompt: list[int], n_gen: int | None, max_tokens: int | None) -> int | None:
    """The token that ended an answer of n_gen tokens: None if it was cut at max_tokens (or either is unknown),
    else the end-of-turn token the chat template put after the user's message (the first end-of-generation token of
    the prompt), which the model emits to end its turn."""
    if n_gen is None or max_tokens is None or n_gen >= max_tokens:
        return None
    return next((t for t in prompt if llm._engine.target.is_eog(t)), None)


def replay(ngram_index, prompt: list[int], answer: list[int], costs: list[float], chunk: int, k_max: int,
           row_ms: float = 0.0, n_context: int | None = None):
    """-> (oracle ms, plain ms, tokens drafted and accepted). `row_ms`: what a verify row adds per token of context
    beyond the profile's 32 (charged to each chunk); `n_context`: the context before the answer (default: the
    prompt's length; a drafting memory indexed before the prompt is not in the context)."""
    ngram_index.clear()
    ngram_index.extend(prompt)
    n_context = len(prompt) if n_context is None else n_context
    i = ms = covered = 0
    while i < len(answer):
        _, proposal = ngram_index.lookup(k_max)
        run = 0
        while run < len(proposal) and i + run < len(answer) and proposal[run] == answer[i + run]:
            run += 1
        ms += verify_ms(costs, run + 1, chunk, row_ms, n_context + i)
        covered += run
        ngram_index.extend(answer[i:i + run + 1])
        i += run + 1
    return ms, len(answer) * costs[0], covered


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a bench/results/*.json of a run that includes the plain system")
    p.add_argument("--threads", type=int, default=2, help="threads of the cost profile (default: 2)")
    args = p.parse_args(argv)
    run = load_or_fail(args.results, "run", system="plain", model=True)

    import specllm
    from specllm import _core

    meta = run["meta"]
    llm = specllm.LLM(meta["target"], draft="ngram", n_threads=args.threads, n_ctx=meta.get("ctx", 4096))
    costs = [c for c in llm._engine.verify_costs()]  # T(1..49), profiled (a size not measured: padded to one that was)
    chunk = _core.exact_verify_rows
    index = _core.NgramIndex(2, 4)
    by_task: dict[str, list[tuple[float, float]]] = {}
    for task, prompt, answer in plain_answers(llm, run):
        ms, plain_ms, covered = replay(index, prompt, answer, costs, chunk, _core.AutoPolicy.n_max)
        by_task.setdefault(task, []).append((plain_ms / ms, covered / len(answer)))
    print(f"T(1..8) = {', '.join(f'{c:.0f}' for c in costs[:8])} ms; verify chunks of {chunk} rows")
    print("| task | oracle speedup (per prompt) | median | drafted fraction |")
    print("|---|---|---:|---|")
    for task, v in by_task.items():
        print(f"| {task} | {' '.join(f'{a:.2f}' for a, _ in v)} | {statistics.median(a for a, _ in v):.2f} | "
              f"{' '.join(f'{b:.0%}' for _, b in v)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
