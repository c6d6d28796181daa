"""Repetitive multi-call work: plain decoding against the default drafter with its cross-request memory off and on.

Runs sequences of same-shaped requests (JSON records, tool calls, tests in one style, edit sessions, docstrings)
on three systems:

    python -m bench.multicall                                       # every sequence, all three systems
    python -m bench.multicall --limit 6 --repeat 2                  # one sequence of each kind, two rounds
    python -m bench.multicall --sequences tool-calls,docstrings --systems plain,memory-on --max-tokens 64

Sequences come from bench/prompts/multicall.jsonl, one per line: {"id", "kind", "mode", "requests", "source"[,
"system"]}. "independent": every request is a fresh single-turn chat (with the sequence's system message, if any);
"conversation": the chat accumulates (user, the system's own reply, user, ...) and is resent whole, as a chat
client does.

Systems, each ONE specllm.LLM kept across a whole sequence:
  plain       draft=None (and memory_tokens=0: the reference does no memory work)
  memory-off  the default drafter (draft model + n-gram, draft_length "auto") with memory_tokens=0
  memory-on   the default drafter with its memory (memory_tokens: the library's default, or --memory-tokens)
  memory-on-noshape  memory-on costing verify batches with the profile's shape (the default; kept for old runs)
  memory-on-learn    memory-on learning batch costs from the timing (not in the default --systems)
  memory-on-ambiguous  memory-on also drafting from a memory match that continues two ways (the default until
                     2026-11-28; not in the default --systems)
  memory-on-busy-profile  memory-on with the Xeon VM's pair profile measured while the machine was busy
                     (bench.systems.BUSY_XEON_PAIR; not in the default --systems)
At the start of every sequence (and of every round of it) each system is reset() and its memory cleared, so the
memory holds only that sequence's earlier outputs, and "auto" is put back as the warm-up left it (since 2026-11-28:
before, a sequence's later rounds started with the memory estimates its earlier round taught, and every sequence with
what the ones before it taught). Within a sequence nothing is reset (reset() would empty the
memory; the KV prefix reuse between requests is what a server gives). Request i runs on every system in turn, the
order rotated by one per request, greedy, max_tokens (256), stopping at end of generation.

Speed-up: a request's tokens/s (generation, prefill excluded) over plain's on the same request in the same round
(median over rounds with --repeat), then the median over requests 1-2 and over requests 3+ of each sequence and of
all sequences. The goal of issue 15: memory-on >= 1.5x plain on requests 3+, and the Spec-Bench tasks no slower.

Results go to bench/results/multicall/<date>-<host>.json (meta, summary, every request) and .md.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import checks, report, tasks
from bench.checks import non_negative_int, positive_int
from bench.multicall_report import markdown, summarize
from bench.run import machine_info, resolve_model, versions
from bench.systems import BUSY_XEON_PAIR

REPO = Path(__file__).resolve().parent.parent
MULTICALL_PATH = REPO / "bench" / "prompts" / "multicall.jsonl"
# written on 2026-11-28, after every policy change so far, to check the memory on sequences it was never tuned on
MULTICALL2_PATH = REPO / "bench" / "prompts" / "multicall2.jsonl"
MULTICALL3_PATH = REPO / "bench" / "prompts" / "multicall3.jsonl"  # written 2026-12-06 (stop 59), only to check
PROMPT_SETS = {"multicall": MULTICALL_PATH, "multicall2": MULTICALL2_PATH, "multicall3": MULTICALL3_PATH}
KINDS = ("json_records", "tool_calls", "pytest_style", "edit_session", "chat_restates", "docstrings")
MODES = ("independent", "conversation")
WARMUP_MESSAGE = "Write one sentence about the sea."
WARMUP_TOKENS = 16

# name -> specllm.LLM keyword arguments; "{draft}" is the --draft model, "{memory}" --memory-tokens (left out when
# not given: the library's default)
SYSTEMS = {
    "plain": {"draft": None, "memory_tokens": 0},  # the reference: nothing drafted, nothing remembered
    "memory-off": {"draft": "{draft}", "ngram": True, "memory_tokens": 0},
    "memory-on": {"draft": "{draft}", "ngram": True, "memory_tokens": "{memory}"},
    # memory on with verify batches costed with the profile's shape (the default again since 2026-11-26's "no timing
    # in the choices"; "engine": Engine setters applied after the load), and with batch costs learned from the timing
    "memory-on-noshape": {"draft": "{draft}", "ngram": True, "memory_tokens": "{memory}",
                          "engine": {"learn_batch_costs": False}},
    "memory-on-learn": {"draft": "{draft}", "ngram": True, "memory_tokens": "{memory}",
                        "engine": {"learn_batch_costs": True}},
    # memory on, drafting also from a memory match whose key the memory continues in more than one way: the default
    # until 2026-11-28
    "memory-on-ambiguous": {"draft": "{draft}", "ngram": True, "memory_tokens": "{memory}",
                            "engine": {"memory_ambiguous_drafts": True}},
    # memory on with the Xeon VM's pair profile measured while the machine was busy (bench.systems.BUSY_XEON_PAIR)
    "memory-on-busy-profile": {"draft": "{draft}", "ngram": True, "memory_tokens": "{memory}",
                               "engine": {"verify_costs": BUSY_XEON_PAIR}},
}


@dataclass
class Sequence:
    id: str
    kind: str            # one of KINDS
    mode: str            # one of MODES
    requests: list[str]  # user messages, in order
    source: str
    system: str | None = None  # a system message sent with every request

    def messages(self, history: list, request: str) -> list[dict]:
        """What a client sends for `request`: history holds the earlier (user, assistant) messages of a
        conversation and is ignored in independent mode."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        earlier = history if self.mode == "conversation" else []
        return head + earlier + [{"role": "user", "content": request}]


def load_sequences(path: Path = MULTICALL_PATH, ids: list[str] | None = None, limit: int | None = None) -> list:
    """The sequences of a .jsonl file (those of `ids`, the first `limit`); tasks.PromptError for a damaged file."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be at least 0 (got {limit})")
    rows = tasks.read_jsonl(path, ("id", "kind", "mode", "requests", "source"), "sequences")
    empty = [str(r["id"]) for r in rows if not r["requests"] or not isinstance(r["requests"], list)]
    if empty:
        raise tasks.PromptError(f"sequences {path}: no requests in {', '.join(empty)}")
    seqs = [Sequence(r["id"], r["kind"], r["mode"], list(r["requests"]), r["source"], r.get("system"))
            for r in rows]
    if ids:
        unknown = sorted(set(ids) - {s.id for s in seqs})
        if unknown:
            raise tasks.PromptError(f"unknown sequence(s) {', '.join(unknown)}: expected some of "
                             f"{', '.join(s.id for s in seqs)}")
        seqs = [s for s in seqs if s.id in ids]
    return seqs[:limit] if limit is not None else seqs


def prompt_set(value: str) -> Path:
    """--prompts: a set's name or a path to a .jsonl file of sequences."""
    if value in PROMPT_SETS:
        return PROMPT_SETS[value]
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no sequences at '{value}': give {' or '.join(PROMPT_SETS)}, or the path "
                                         "of a .jsonl file with one sequence per line")
    return path


def llm_kwargs(name: str, draft: str, memory_tokens: int | None) -> dict:
    kwargs = {}
    for key, value in SYSTEMS[name].items():
        if value == "{memory}":
            if memory_tokens is not None:
                kwargs[key] = memory_tokens
        elif value == "{draft}":
            kwargs[key] = draft
        else:
            kwargs[key] = value
    if kwargs.get("draft") == "ngram":  # the n-gram drafter alone: ngram=True is for a draft model's hybrid
        kwargs.pop("ngram", None)
    return kwargs


@dataclass
class System:
    name: str
    kwargs: dict
    llm: object = None
    load_ms: float = 0.0
    history: list = field(default_factory=list)  # the conversation so far (conversation mode)
    failed: bool = False                          # a request failed: the rest of this sequence round is skipped
    policy: object = None                         # "auto" after the warm-up (specllm._core.AutoPolicy)

    def load(self, target: str, threads: int, ctx: int) -> None:
        import specllm

        from bench.systems import apply_engine_settings

        kwargs = dict(self.kwargs)
        engine_settings = kwargs.pop("engine", {})
        t0 = time.perf_counter()
        self.llm = specllm.LLM(target, n_threads=threads, n_ctx=ctx, **kwargs)
        apply_engine_settings(self.llm, engine_settings)
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.llm.chat([{"role": "user", "content": WARMUP_MESSAGE}], max_tokens=WARMUP_TOKENS)  # excluded
        self.policy = self.llm._engine.policy_state()  # what every sequence and round starts from

    def close(self) -> None:
        self.llm.close()
        self.llm = None

    def start_sequence(self) -> None:
        """Every sequence (and round) starts cold and alike on every system: an empty KV cache, an empty memory,
        and "auto" as the warm-up left it (not with the memory's acceptance estimates that an earlier sequence, or
        the sequence's own earlier round, taught it). reset() clears the memory too; clear_memory() says so."""
        self.llm.reset()
        self.llm.clear_memory()
        self.llm._engine.set_policy_state(self.policy)
        self.history, self.failed = [], False

    def run(self, seq: Sequence, request: str, max_tokens: int) -> dict:
        messages = seq.messages(self.history, request)
        t0 = time.perf_counter()
        out = self.llm.chat(messages, max_tokens=max_tokens, temperature=0.0, ignore_eos=False)
        wall = time.perf_counter() - t0
        if seq.mode == "conversation":
            self.history += [{"role": "user", "content": request}, {"role": "assistant", "content": out.text}]
        s = out.stats
        return {"text": out.text, "finish_reason": out.finish_reason, "n_gen": s.n_generated,
                "gen_tps": s.tokens_per_second, "wall_s": wall, "prompt_ms": s.prefill_ms, "n_prompt": s.n_prompt,
                "n_cached": s.n_cached, "n_steps": s.n_steps, "n_drafted": s.n_drafted, "n_accepted": s.n_accepted,
                "n_ngram_steps": s.n_ngram_steps, "n_memory_steps": s.n_memory_steps,
                "memory_size": self.llm.memory_size}  # tokens in the memory after this request

    def memory_tokens(self) -> int:
        """The memory size this system runs with: its own memory_tokens, else specllm.LLM's default."""
        import inspect

        import specllm

        if "memory_tokens" in self.kwargs:
            return self.kwargs["memory_tokens"]
        return inspect.signature(specllm.LLM).parameters["memory_tokens"].default


# --- main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.multicall", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b",
                   help="GGUF path or registry name of the draft model (or 'ngram'), for memory-off and memory-on")
    p.add_argument("--systems", default="plain,memory-off,memory-on",
                   help=f"comma-separated, from: {', '.join(SYSTEMS)} (default: %(default)s)")
    p.add_argument("--sequences", default="", help="comma-separated sequence ids (default: all, in file order)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N sequences (default: all)")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="new tokens per request (default: %(default)s)")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="rounds: every sequence runs N times from a cold start, rounds interleaved per sequence; a "
                        "request's speed-up is the median of its rounds' ratios (default: %(default)s)")
    p.add_argument("--reload-rounds", action="store_true",
                   help="rounds outer: every round runs all sequences, with the systems closed and loaded afresh in "
                        "an order rotated by one per round (where the LLM a process loads first runs slower, "
                        "bench/README stop 53, --repeat a multiple of the systems' count gives each every place)")
    p.add_argument("--memory-tokens", type=non_negative_int, default=None,
                   help="memory-on's memory_tokens (default: the library's default)")
    p.add_argument("--threads", type=positive_int, default=2, help="CPU threads (default: %(default)s)")
    p.add_argument("--ctx", type=positive_int, default=8192,
                   help="context size; the conversations grow to ~3k tokens at 256 tokens a reply (default: "
                        "%(default)s)")
    p.add_argument("--prompts", type=prompt_set, default=MULTICALL_PATH,
                   help=f"the sequences: {' or '.join(PROMPT_SETS)} (bench/prompts/NAME.jsonl) or a .jsonl path "
                        "(default: multicall)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "multicall", help="output folder")
    args = p.parse_args(argv)
    args.system_names = checks.names_in(p, "--systems", args.systems, SYSTEMS)
    args.argv = argv
    return args


def read_sequences(args) -> list:
    """The sequences of the run, read before any model loads (else fail())."""
    try:
        sequences = load_sequences(args.prompts, [s for s in args.sequences.split(",") if s] or None, args.limit)
    except tasks.PromptError as e:
        checks.fail(str(e))
    if not sequences:
        checks.fail(f"no sequences to run in {args.prompts}")
    return sequences


def main(argv=None) -> int:
    args = parse_args(argv)
    sequences = read_sequences(args)
    checks.out_dir(args.out)
    return checks.measured(lambda started: measure(args, sequences, started))


def load(system: System, target: str, args) -> None:
    """A system that cannot load ends the run: nothing to compare."""
    try:
        system.load(target, args.threads, args.ctx)
    except Exception as e:
        checks.fail(f"system {system.name} could not load: {type(e).__name__}: {e}")


def measure(args, sequences: list, started) -> int:
    """Load the systems, run the sequences, write the results; started(path) is told the records log's path."""
    names = args.system_names
    target = resolve_model(args.target)
    draft = args.draft if args.draft == "ngram" else resolve_model(args.draft, "--draft")
    notes: list[str] = []
    systems = []
    for name in names:
        system = System(name, llm_kwargs(name, draft, args.memory_tokens))
        load(system, target, args)
        print(f"loaded {name} in {system.load_ms:.0f} ms", file=sys.stderr)
        systems.append(system)
    meta = {**machine_info(), "date": datetime.date.today().isoformat(),
            "command": "python -m bench.multicall " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
            "target": target, "draft": draft, "max_tokens": args.max_tokens, "threads": args.threads,
            "ctx": args.ctx, "repeat": args.repeat, "limit": args.limit, "prompts": str(args.prompts),
            "sequences": [s.id for s in sequences], "systems": names, "reference": "plain",
            "llm_kwargs": {s.name: s.kwargs for s in systems}, "memory_tokens": {s.name: s.memory_tokens()
                                                                                 for s in systems},
            "load_ms": {s.name: round(s.load_ms) for s in systems}, "versions": versions(), "notes": notes,
            "reload_rounds": args.reload_rounds, "load_order": [names], "reload_ms": [],
            "chat_template": "jinja"}  # bench.oracle.chat_template_of
    log_path = checks.records_log(args.out, f"{meta['date']}-{meta['machine']}", started)
    records, t_start, turn = [], time.perf_counter(), 0
    with open(log_path, "w", encoding="utf-8") as log:  # survives a crash mid-run
        def run_round(si: int, seq: Sequence, rep: int) -> None:
            nonlocal turn
            for system in systems:
                system.start_sequence()
            for i, request in enumerate(seq.requests):
                for system in report.rotate(systems, turn):
                    if system.failed:
                        continue
                    try:
                        result = system.run(seq, request, args.max_tokens)
                    except Exception as e:  # noted; this system skips the rest of the sequence round
                        system.failed = True
                        notes.append(f"{system.name} failed on {seq.id} request {i + 1} (round {rep}): "
                                     f"{type(e).__name__}: {e}")
                        print(notes[-1], file=sys.stderr)
                        continue
                    rec = {"system": system.name, "sequence": seq.id, "kind": seq.kind, "mode": seq.mode,
                           "request": i, "rep": rep, **result}
                    records.append(rec)
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                turn += 1
            print(f"[{si + 1}/{len(sequences)}] {seq.id} round {rep + 1}/{args.repeat} "
                  f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)

        if args.reload_rounds:
            for rep in range(args.repeat):
                if rep > 0:
                    order = report.rotate(systems, rep)
                    for system in systems:  # all closed first, so that each load takes the place its turn gives
                        system.close()
                    gc.collect()
                    for system in order:  # a system that cannot load again ends the run, as at the start
                        load(system, target, args)
                    meta["load_order"].append([s.name for s in order])
                    meta["reload_ms"].append({s.name: round(s.load_ms) for s in order})
                    print(f"round {rep + 1}: loaded " + ", ".join(f"{s.name} in {s.load_ms:.0f} ms" for s in order),
                          file=sys.stderr)
                for si, seq in enumerate(sequences):
                    run_round(si, seq, rep)
        else:
            for si, seq in enumerate(sequences):
                for rep in range(args.repeat):
                    run_round(si, seq, rep)
    if not records:
        checks.nothing_measured(log_path, "every request failed")
    meta["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    summary = summarize(records, names, sequences, args.max_tokens)
    md = markdown(summary, meta, sequences)
    checks.write_results(log_path, {"json": json.dumps({"meta": meta, "summary": summary, "records": records},
                                                        indent=1), "md": md})
    print(md)
    return 0


if __name__ == "__main__":
    checks.sigterm_exits()
    sys.exit(main())
