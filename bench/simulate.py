"""Replay a run's plain answers through the "auto" policy and the n-gram drafter, without the model.

    python -m bench.simulate bench/results/policy/2026-11-22-vm.json [more runs ...] [--no-doubt]

Deterministic and fast (seconds), so that policy changes can be compared on the same answers, where a timed run
on a shared 2-core machine moves by 0.1x between runs. For each task, the prompts' plain (greedy) answers are
replayed in run order through one AutoPolicy (its state carries over, as in an LLM object) and the n-gram index:
each step the policy picks k, the drafter proposes, and the draft is accepted as far as it agrees with the
answer (greedy verification of the target's own output). Time is the profiled T(n) of this machine, verify rows
in exact chunks of 3, each decoded only if reached. Prints the simulated speedup per task and the oracle's (every
step drafts exactly the agreeing tokens). It ignores what a real run adds: context growth, near-tie flips,
timing noise.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from bench.checks import fail
from bench.oracle import context_ms, verify_ms
from bench.results_file import kind_of, load_or_fail


def simulate(policy, index, prompt: list[int], answer: list[int], costs: list[float], chunk: int, doubt: bool,
             k_limit: int, memory: list[int] = (), row_ms: float = 0.0, end: int | None = None,
             max_tokens: int | None = None, boundary_of=None, cut=None, ambiguous_memory: bool = False,
             log: list | None = None):
    """-> (ms, plain ms, drafted, accepted, steps, memory steps). `memory`: the drafting memory's tokens (earlier
    outputs, each followed by the separator -1), indexed before the prompt: a match whose source lies in it is a
    memory proposal, as in the engine, where the memory's match is taken when it agrees further back than the
    text's (one index over both picks the same occurrence; ties go to the text, the newer). A memory match whose key
    continues in more than one way is not drafted from, the text's own match stands (the engine since 2026-11-28;
    here ambiguity is over memory and text together, in the engine over the memory alone); ambiguous_memory=True
    drafts from it, as before. `row_ms`: what a verify
    row adds per token of context beyond the profile's (the profile's context_row_ms; 0 = context costs nothing):
    the policy is told it and the context, and a batch is charged it, as on the machine that measured it.
    `end`: the token that ended the answer (None: it was cut at max_tokens). The engine does not know where an
    answer ends: it drafts up to max_tokens, and a draft that runs past the answer's end is rejected there (the
    model emits `end` instead); without `end` the answer's last token is the last that can be drafted.
    `boundary_of(last, proposal)`: the first position of a proposal right after the end of a sentence, or -1 (the
    target Model's sentence_boundary, as the engine tells the policy); None: no boundaries. `cut(proposal)`: the
    proposal up to its first end-of-turn token (the target Model's cut_after_end: what follows can never be
    accepted, and the engine drafts no further); None: proposals are not cut. `log`: a list that gets, for every
    step with a match, (answer position, match length, doubtful, from memory, the source's estimates per position,
    k, first chunk's rows, tokens accepted or None for a shadow step, the shadow's outcome or None, ms) (--trace)."""
    from specllm import _core

    index.clear()
    index.extend(list(memory) + list(prompt))
    text_index = _core.NgramIndex(2, 4)  # the text alone, for the match that stands beside an ambiguous memory one
    text_index.extend(list(prompt))
    n_mem = len(memory)
    text = list(answer) + ([] if end is None else [end])  # what the model emits, its end of turn included
    budget = len(answer) if end is None or max_tokens is None else max(max_tokens, len(answer))
    i = ms = drafted = accepted = steps = mem_steps = 0
    while i < len(answer):
        length, ambiguous, source = index.match()
        lookup = index.lookup
        if length > 0 and source < n_mem and ambiguous and not ambiguous_memory:
            length, ambiguous, source = text_index.match()
            source, lookup = source + n_mem, text_index.lookup
        from_memory = length > 0 and source < n_mem
        doubtful = doubt and not from_memory and (ambiguous or source >= n_mem + len(prompt))
        k_max = min(k_limit, budget - i - 1)
        n_past = len(prompt) + i
        # what the drafter would propose, looked up once: a draft of k is its first k tokens (the match does not
        # depend on the length asked for), and the policy is told where it crosses a sentence end
        ahead = lookup(k_max)[1] if k_max > 0 and length > 0 else []
        if cut is not None:
            ahead = cut(ahead)
        boundary = -1 if boundary_of is None or not ahead else boundary_of(text[i - 1] if i > 0 else prompt[-1], ahead)
        estimates = (list(policy.acceptance(_core.AutoPolicy.source_of(True, length, doubtful, from_memory)))
                     if log is not None and length > 0 else None)
        k = (policy.choose(k_max, False, True, length, 1, doubtful, from_memory, n_past, boundary)[0]
             if k_max > 0 and length > 0 else 0)
        run, proposal = 0, ahead[:k]
        if k > 0:
            while run < len(proposal) and i + run < len(text) and proposal[run] == text[i + run]:
                run += 1
        rows = len(proposal) + 1
        first = policy.first_rows() if chunk > _core.AutoPolicy.n_max else 0  # fast mode: a first chunk alone
        if 0 < first < rows:
            reached = first if run < first else rows  # the rest only if every draft in the first was accepted
            cost = costs[first - 1] + context_ms(row_ms, first, n_past)
            if reached == rows:
                cost += costs[rows - first - 1] + context_ms(row_ms, rows - first, n_past)
        else:
            reached = min(rows, -(-(run + 1) // chunk) * chunk)  # chunks after the rejecting one are skipped
            cost = verify_ms(costs, reached, chunk, row_ms, n_past)
        policy.update(len(proposal), run, bool(proposal), 0.02 * len(proposal), cost, 0, reached)
        shadow = None
        if not proposal and length > 0:  # as the engine: would the proposal's first token have been right?
            _, first_token = lookup(1)
            shadow = first_token[0] == text[i]
            policy.observe_shadow(length, doubtful, shadow, from_memory, boundary == 0)
        if log is not None and length > 0:
            log.append((i, length, doubtful, from_memory, estimates, len(proposal), first if proposal else 0,
                        run if proposal else None, shadow, cost))
        ms += cost
        mem_steps += bool(proposal) and from_memory
        drafted += len(proposal)
        accepted += run
        steps += 1
        index.extend(text[i:i + run + 1])
        text_index.extend(text[i:i + run + 1])
        i += run + 1  # past len(answer) when the step emitted the end of turn
    return ms, len(answer) * costs[0], drafted, accepted, steps, mem_steps


def new_policy(costs: list[float], chunk: int, row_ms: float = 0.0):
    """An AutoPolicy costed as the engine's: the profile's T(n), verify chunks of `chunk` rows, what a row adds per
    token of context."""
    from specllm import _core

    policy = _core.AutoPolicy()
    policy.set_verify_costs(costs)
    policy.set_verify_rows(chunk)
    policy.set_context_row_cost(row_ms)
    return policy


def replayed_policy(flat: list, costs: list[float], chunk: int, carry_over: dict, row_ms: float = 0.0,
                    boundary_of=None, cut=None, policy_costs: list[float] | None = None):
    """A policy that has replayed `flat` ((task, prompt, answer, end, max_tokens) items) in order with the drafting
    memory on, as one LLM serves them: what it learned there is what the next work starts from. policy_costs: the
    profile it drafts with, where the steps cost `costs` (default: the same)."""
    from specllm import _core

    policy, index, memory = new_policy(policy_costs or costs, chunk, row_ms), _core.NgramIndex(2, 4), []
    for _, prompt, answer, end, max_tokens in flat:
        policy.new_generation(**carry_over)
        simulate(policy, index, prompt, answer, costs, chunk, True, _core.AutoPolicy.n_max, memory, row_ms, end,
                 max_tokens, boundary_of, cut)
        memory = memory + answer + [-1]
    return policy


def parse_costs(text: str, flag: str = "--costs") -> list[float]:
    """"T(1),T(2),..." (ms; 0 = not measured) -> T(1..49) as the policy fills them in (a size not measured costs
    the next measured one, as the engine pads it)."""
    try:
        given = [float(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag}: comma-separated ms for T(1), T(2), ..., got {text!r}") from None
    try:
        return list(new_policy(given, 0).verify_costs())
    except ValueError as e:  # T(1) missing or not > 0
        raise SystemExit(f"{flag}: {e}") from None


CARRY_OVER = ("carry", "keep", "text_carry", "text_keep")  # AutoPolicy.new_generation's arguments
ROUNDS = 3  # --orders replays a prompt this many times in a row, as bench.run --repeat 3 runs it


def order_spread(flat: list, costs: list[float], chunk: int, carry_over: dict, n_orders: int, doubt: bool = True,
                 seed: int = 1, row_ms: float = 0.0, boundary_of=None, cut=None) -> dict:
    """How much a prompt's speed-up depends on the prompts before it: every (task, prompt, answer[, end, max_tokens]) of
    `flat` replayed
    through ONE policy (as one LLM serves them) in the given order and in n_orders - 1 shuffled ones, each prompt
    ROUNDS times in a row (its speed-up: the median of its rounds). -> {"spread": per prompt, max - min over the
    orders; "speedup": per prompt, the median over the orders; "task": per prompt, its task}"""
    import random

    from specllm import _core

    rng = random.Random(seed)
    ids = list(range(len(flat)))
    orders = [ids] + [rng.sample(ids, len(ids)) for _ in range(n_orders - 1)]
    index = _core.NgramIndex(2, 4)
    by_order = []
    for order in orders:
        policy = new_policy(costs, chunk, row_ms)
        got = {}
        for i in order:
            _, prompt, answer, *ends = flat[i]
            end, max_tokens = ends or (None, None)
            rounds = []
            for _ in range(ROUNDS):
                policy.new_generation(**carry_over)
                ms, plain_ms, *_ = simulate(policy, index, prompt, answer, costs, chunk, doubt, _core.AutoPolicy.n_max,
                                            (), row_ms, end, max_tokens, boundary_of, cut)
                rounds.append(plain_ms / ms)
            got[i] = statistics.median(rounds)
        by_order.append(got)
    return {"spread": [max(o[i] for o in by_order) - min(o[i] for o in by_order) for i in ids],
            "speedup": [statistics.median(o[i] for o in by_order) for i in ids], "task": [item[0] for item in flat]}


def print_order_spread(r: dict, n_orders: int) -> None:
    spread = sorted(r["spread"])
    n = len(spread)
    print(f"{n_orders} orders, {n} prompts: a prompt's speed-up moves by {statistics.median(spread):.3f} (median), "
          f"{spread[int(0.9 * (n - 1))]:.3f} (p90), {spread[-1]:.3f} (max); {sum(x <= 0.05 for x in spread)} of {n} "
          f"within 0.05")
    print("| task | prompts | speed-up (median over prompts of the median over orders) |")
    print("|---|---:|---:|")
    for task in dict.fromkeys(r["task"]):
        mine = [x for x, t in zip(r["speedup"], r["task"]) if t == task]
        print(f"| {task} | {len(mine)} | {statistics.median(mine):.3f} |")
    print(f"| all | {n} | {statistics.median(r['speedup']):.3f} |")


def print_trace(name: str, n_prompt: int, n_answer: int, speedup: float, step_ms: float, log: list) -> None:
    """The steps simulate() logged for one answer (--trace), one line each."""
    print(f"{name}: prompt {n_prompt} tokens, answer {n_answer}, replayed {speedup:.2f}x plain")
    for i, length, doubtful, memory, est, k, first, run, shadow, ms in log:
        kind = "memory" if memory else "doubtful" if doubtful else "clean"
        head = f"  token {i:4d}: {kind} match of {length:2d}"
        if k == 0:
            print(f"{head}, no draft; its first token {'right' if shadow else 'wrong'}")
            continue
        batch = f"a {first}-row probe, then the rest" if first else "one batch"
        print(f"{head}, estimates {' '.join(f'{a:.2f}' for a in est[:min(k, 6)])}{' ...' if k > 6 else ''}: "
              f"k = {k} in {batch}, {run} accepted, {ms:.0f} ms for {run + 1} token{'s' if run else ''} "
              f"({ms / step_ms / (run + 1):.2f} steps a token)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="bench/results/*.json of runs that include the plain system")
    p.add_argument("--threads", type=int, default=2, help="threads of the cost profile (default: 2)")
    p.add_argument("--no-doubt", action="store_true", help="treat every n-gram match as clean")
    p.add_argument("--one-policy", action="store_true",
                   help="one policy for all tasks in order (as one LLM object serves them in a bench run)")
    p.add_argument("--carry", type=int, default=None,
                   help="observations per source and position a new prompt carries over, for the drafting memory's "
                        "sources (default: the engine's)")
    p.add_argument("--keep", type=float, default=None,
                   help="share of what was learned (over the prior) a new prompt keeps, for the memory's sources "
                        "(default: the engine's)")
    p.add_argument("--text-carry", type=int, default=None, help="--carry for the n-gram sources over the text "
                                                                 "(default: the engine's, 0)")
    p.add_argument("--text-keep", type=float, default=None, help="--keep for the n-gram sources over the text "
                                                                  "(default: the engine's, 0: a new prompt starts from "
                                                                  "the priors)")
    p.add_argument("--fast", action="store_true", help="costs of exact=False (llama.cpp's batch kernels, one batch)")
    p.add_argument("--orders", type=int, default=0,
                   help="replay every prompt with one policy in the run's order and N-1 shuffled ones, each prompt "
                        f"{ROUNDS} times in a row, and print how much a prompt's speed-up depends on the order")
    p.add_argument("--costs", default=None,
                   help="replay with another machine's verify costs instead of this one's profile: T(1),T(2),... in "
                        "ms (0 = not measured; padded to the next measured size, as the engine does), e.g. the first "
                        "dev VM's fast-mode "
                        "profile: 54,86,108,115,147,172,198,291,0,0,0,0,0,0,0,365")
    p.add_argument("--policy-costs", default=None, metavar="T(1),T(2),...",
                   help="the profile the policy drafts with, where --costs (or this machine's profile) is what the "
                        "steps cost: what a wrong profile costs, e.g. bench.systems.BUSY_XEON_PAIR (not with --orders; "
                        "the policy is told the context cost the steps are charged, --context-ms)")
    p.add_argument("--memory", action="store_true",
                   help="a drafting memory of the earlier prompts' answers in run order, as bench.run's default system "
                        "keeps (one LLM; a prompt never finds its own answer there)")
    p.add_argument("--context-ms", type=float, default=None,
                   help="ms a verify row adds per token of context beyond the profile's, told to the policy and charged "
                        "to every batch (default: this machine's profile's context_row_ms; 0: context costs nothing)")
    p.add_argument("--policy-context-ms", type=float, default=None,
                   help="what the policy is told a row adds per token of context, where --context-ms (or the "
                        "profile's) is what the steps are charged: what a context cost measured high or low costs "
                        "(Spec-Bench runs only)")
    p.add_argument("--no-end", action="store_true",
                   help="never draft past an answer's last token (as replays did before 2026-11-25: they knew where "
                        "each answer ends, which the engine does not)")
    p.add_argument("--no-boundary", action="store_true",
                   help="do not tell the policy where a proposal crosses the end of a sentence (as the engine did "
                        "before 2026-11-25)")
    p.add_argument("--after", default=None, metavar="RUN.json",
                   help="with a bench.multicall run: the policy first replays this Spec-Bench run's answers (memory "
                        "on, in order), so the sequences start from what it learned there (default: a fresh policy)")
    p.add_argument("--answers", default="plain",
                   help="whose answers to replay (default: %(default)s; e.g. hybrid: the default's own answers, "
                        "which differ from plain's in fast mode)")
    p.add_argument("--each", action="store_true",
                   help="after the table, every answer's replayed speed-up (TASK-N X.XXX, one per line): for "
                        "geometric means over several invocations' answers, or a task's")
    p.add_argument("--trace", default=None, metavar="TASK-N[,...]",
                   help="print every step with a match of these answers (rag-1: the first RAG answer in run order): "
                        "the match, the source's estimates, k, the first chunk, what was accepted, its ms")
    args = p.parse_args(argv)
    traced = set() if args.trace is None else set(args.trace.split(","))
    if traced and args.orders > 0:
        p.error("--trace prints the replay's own steps, not --orders': leave one out")
    if args.policy_costs is not None and args.orders > 0:
        p.error("--policy-costs is not used by --orders: leave one out")
    policy_costs = None if args.policy_costs is None else parse_costs(args.policy_costs, "--policy-costs")
    if args.policy_context_ms is not None and args.orders > 0:
        p.error("--policy-context-ms is not used by --orders: leave one out")
    runs = [load_or_fail(path, ("run", "multicall"), args.answers, model=i == 0) for i, path in enumerate(args.results)]
    if args.after is not None and kind_of(runs[0]) != "multicall":
        p.error(f"--after applies to a bench.multicall run; {args.results[0]} is a bench.run results file")
    after_run = None if args.after is None else load_or_fail(args.after, "run", args.answers)

    import specllm
    from specllm import _core
    from bench.oracle import plain_answers, replay

    llm = None
    flat: list = []  # (task, prompt tokens, answer tokens, end token or None, max_tokens) in run order
    seen: set = set()
    carry_over = {k: v for k, v in vars(args).items() if k in CARRY_OVER and v is not None}
    for run in runs:
        if llm is None:
            meta = run["meta"]
            llm = specllm.LLM(meta["target"], draft="ngram", n_threads=args.threads, n_ctx=meta.get("ctx", 4096),
                              exact=not args.fast,  # the machine's profile measured only where it is used
                              profile_costs=args.costs is None or args.context_ms is None)
            costs = list(llm._engine.verify_costs()) if args.costs is None else parse_costs(args.costs)
            chunk = _core.AutoPolicy.n_max + 1 if args.fast else _core.exact_verify_rows
            row_ms = (llm.profile or {}).get("context_row_ms", 0.0) if args.context_ms is None else args.context_ms
            boundary_of = None if args.no_boundary else llm._engine.target.sentence_boundary
            cut = llm._engine.target.cut_after_end
            print(f"T(1..8) = {', '.join(f'{c:.0f}' for c in costs[:8])}, T(16) = {costs[15]:.0f}, "
                  f"T(32) = {costs[31]:.0f} ms; verify chunks of {chunk} rows; a row adds {row_ms:.4f} ms per token "
                  "of context")
            if args.policy_context_ms is not None:
                print(f"the policy is told a row adds {args.policy_context_ms:.4f} ms per token of context "
                      "(--policy-context-ms)")
            if policy_costs is not None:
                print(f"the policy drafts with T(1..8) = {', '.join(f'{c:.0f}' for c in policy_costs[:8])}, "
                      f"T(16) = {policy_costs[15]:.0f} ms (--policy-costs; the same context cost)")
        def items(run: dict, seen: set) -> list:  # (task, prompt, answer, end, max_tokens) of a Spec-Bench run
            return [(t, prompt, answer, None if args.no_end else end, run["meta"].get("max_tokens"))
                    for t, prompt, answer, end in plain_answers(llm, run, seen, args.answers, ends=True)]

        if "sequence" in run["records"][0]:  # a bench.multicall run
            if args.policy_context_ms is not None:
                p.error("--policy-context-ms replays Spec-Bench runs only (bench.run), not bench.multicall's")
            if traced:
                p.error("--trace traces Spec-Bench runs only (bench.run), not bench.multicall's")
            after = [] if after_run is None else items(after_run, set())
            from bench.simulate_multicall import main_sequences

            return main_sequences(run, llm, costs, chunk, carry_over, args.answers, row_ms, not args.no_end,
                                  boundary_of, cut, after, policy_costs)
        flat.extend(items(run, seen))
    if not flat:
        fail(f"no {args.answers} answers to replay in {', '.join(args.results)} (every one empty)")
    if args.orders > 0:
        print_order_spread(order_spread(flat, costs, chunk, carry_over, args.orders, not args.no_doubt, 1, row_ms,
                                        boundary_of, cut),
                           args.orders)
        return 0
    answers: dict[str, list] = {}  # task -> [(prompt tokens, answer tokens, end, max_tokens)] in run order
    for task, *item in flat:
        answers.setdefault(task, []).append(item)
    print("| task | prompts | policy (median) | oracle (median) | drafted | accepted | steps/token | memory steps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    index = _core.NgramIndex(2, 4)
    policy = None
    memory: list[int] = []
    every: list[float] = []
    each: dict[str, list[float]] = {}  # task -> its answers' replayed speed-ups, in run order
    for task, pairs in answers.items():
        if policy is None or not args.one_policy:
            policy = new_policy(policy_costs or costs, chunk,
                                row_ms if args.policy_context_ms is None else args.policy_context_ms)
        sims, oracles, tot = [], [], [0, 0, 0, 0, 0]
        for n, (prompt, answer, end, max_tokens) in enumerate(pairs, 1):
            policy.new_generation(**carry_over)  # as Engine::start
            log = [] if f"{task}-{n}" in traced else None
            ms, plain_ms, d, a, s, m = simulate(policy, index, prompt, answer, costs, chunk, not args.no_doubt,
                                                _core.AutoPolicy.n_max, memory, row_ms, end, max_tokens, boundary_of,
                                                cut, log=log)
            if log is not None:
                print_trace(f"{task}-{n}", len(prompt), len(answer), plain_ms / ms, costs[0], log)
            if args.memory:
                memory = memory + answer + [-1]
            sims.append(plain_ms / ms)
            oms, oplain, _ = replay(index, prompt, answer, costs, chunk, _core.AutoPolicy.n_max, row_ms)
            oracles.append(oplain / oms)
            for j, v in enumerate((d, a, s, len(answer), m)):
                tot[j] += v
        print(f"| {task} | {len(pairs)} | {statistics.median(sims):.2f} | {statistics.median(oracles):.2f} | "
              f"{tot[0]} | {tot[1]} ({tot[1] / max(1, tot[0]):.0%}) | {tot[2] / tot[3]:.2f} | {tot[4]} |")
        every += sims
        each[task] = sims
    print(f"geometric mean over {len(every)} answers: {statistics.geometric_mean(every):.4f}; "
          f"below 0.97: {sum(x < 0.97 for x in every)}")
    if args.each:
        for task, speedups in each.items():
            print("\n".join(f"{task}-{n} {x:.3f}" for n, x in enumerate(speedups, 1)))
    missing = traced - {f"{task}-{n}" for task, pairs in answers.items() for n in range(1, len(pairs) + 1)}
    if missing:
        counts = ", ".join(f"{task} {len(pairs)}" for task, pairs in answers.items())
        print(f"--trace: no answer {', '.join(sorted(missing))} in these runs (TASK-N is the task's n-th answer in run "
              f"order; answers per task: {counts})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
