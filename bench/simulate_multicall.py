"""bench.simulate for bench.multicall's runs: their sequences' answers replayed through one "auto" policy carried
through all of them (as one LLM serves them), with the drafting memory of each sequence's earlier answers off and on
(`python -m bench.simulate RUN.json` with a multicall run)."""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.simulate import replayed_policy, simulate


def sequence_answers(llm, run: dict, system: str = "plain", ends: bool = False):
    """(sequence id, request index, prompt tokens, answer tokens) of a bench.multicall run's answers of `system`
    (first round), in run order; a conversation's prompt holds the earlier turns with that system's replies.
    ends=True: a fifth item, the token that ended the answer or None (bench.oracle.end_token)."""
    from bench import multicall
    from bench.oracle import chat_template_of, end_token

    # the run's set of sequences (meta "prompts", a path; found by its name under bench/prompts in another clone)
    path = Path(run["meta"].get("prompts") or multicall.MULTICALL_PATH)
    path = path if path.is_file() else multicall.REPO / "bench" / "prompts" / path.name
    seqs = {s.id: s for s in multicall.load_sequences(path, ids=run["meta"]["sequences"])}
    for sid in run["meta"]["sequences"]:
        recs = sorted((r for r in run["records"] if r["system"] == system and r["sequence"] == sid and
                       r.get("rep", 0) == 0), key=lambda r: r["request"])
        history: list = []
        for r in recs:
            request = seqs[sid].requests[r["request"]]
            text = llm.apply_chat_template(seqs[sid].messages(history, request), add_generation_prompt=True,
                                           chat_template=chat_template_of(run["meta"]))
            history += [{"role": "user", "content": request}, {"role": "assistant", "content": r["text"]}]
            answer = llm.tokenize(r["text"], add_special=False)
            if answer:
                prompt = llm.tokenize(text)
                if ends:
                    yield sid, r["request"], prompt, answer, end_token(llm, prompt, r.get("n_gen"),
                                                                       run["meta"].get("max_tokens"))
                else:
                    yield sid, r["request"], prompt, answer


def simulate_sequences(policy, index, answers, costs: list[float], chunk: int, memory_on: bool, k_limit: int,
                       carry_over: dict, row_ms: float = 0.0, max_tokens: int | None = None,
                       boundary_of=None, cut=None) -> dict:
    """Replay multi-call sequences with one policy carried through all of them (as one LLM in bench.multicall)
    and, with memory_on, a drafting memory of the sequence's earlier answers. `answers`: sequence_answers' items,
    with or without the end token. -> {sequence: [(request, policy speedup, oracle speedup, memory steps, steps)]}"""
    from bench.oracle import replay

    out: dict = {}
    memory: list[int] = []
    for sid, request, prompt, answer, *end in answers:
        if sid not in out:
            memory = []  # bench.multicall clears the memory at the start of each sequence (the policy stays)
            out[sid] = []
        mem = memory if memory_on else []
        policy.new_generation(**carry_over)
        ms, plain_ms, _, _, steps, mem_steps = simulate(policy, index, prompt, answer, costs, chunk, True, k_limit,
                                                        mem, row_ms, end[0] if end else None, max_tokens, boundary_of,
                                                        cut)
        oms, oplain, _ = replay(index, mem + prompt, answer, costs, chunk, k_limit, row_ms, len(prompt))
        out[sid].append((request, plain_ms / ms, oplain / oms, mem_steps, steps))
        memory = memory + answer + [-1]
    return out


def main_sequences(run: dict, llm, costs: list[float], chunk: int, carry_over: dict, answers_of: str,
                   row_ms: float = 0.0, ends: bool = True, boundary_of=None, cut=None, after: list = (),
                   policy_costs: list[float] | None = None) -> int:
    """`after`: Spec-Bench items the policy replays first (--after), or none: it starts fresh."""
    from specllm import _core

    answers = list(sequence_answers(llm, run, answers_of, ends))
    print("| sequence | memory | policy, requests 1-2 | policy, 3+ | oracle, 1-2 | oracle, 3+ | memory steps / steps |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for memory_on in (False, True):
        policy = replayed_policy(list(after), costs, chunk, carry_over, row_ms, boundary_of, cut, policy_costs)
        rows = simulate_sequences(policy, _core.NgramIndex(2, 4), answers, costs, chunk,
                                  memory_on, _core.AutoPolicy.n_max, carry_over, row_ms, run["meta"].get("max_tokens"),
                                  boundary_of, cut)
        every = [row for v in rows.values() for row in v]
        for sid, v in list(rows.items()) + [("all", every)]:
            def med(col, late):
                xs = [row[col] for row in v if (row[0] >= 2) == late]
                return f"{statistics.median(xs):.2f}" if xs else "–"
            print(f"| {sid} | {'on' if memory_on else 'off'} | {med(1, False)} | {med(1, True)} | {med(2, False)} | "
                  f"{med(2, True)} | {sum(r[3] for r in v)} / {sum(r[4] for r in v)} |")
    return 0
