"""Spec-Bench-style speed table: specllm against llama.cpp and llama-cpp-python, interleaved per prompt.

    python -m bench.run --limit 2                      # quick look, every system
    python -m bench.run --systems plain,draft-k3,llama.cpp --tasks code_edit,qa --limit 5
    python -m bench.run --systems plain,hybrid --prompts fresh   # the check-only prompt set

See bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import platform
import re
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench import checks, report, tasks
from bench.checks import non_negative_float, non_negative_int, positive_int
from bench.systems import ALL_SYSTEMS, SPECLLM_SYSTEMS, Config, SpecllmSystem, make_system

REPO = Path(__file__).resolve().parent.parent
WARMUP_MESSAGE = "Write one sentence about the sea."
WARMUP_TOKENS = 16


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=positive_int, default=None, help="prompts per task (default: all)")
    p.add_argument("--skip", type=non_negative_int, default=0,
                   help="prompts per task left out before --limit takes its share (a set not yet looked at: "
                        "default: %(default)s)")
    p.add_argument("--tasks", default=",".join(tasks.ALL_TASKS), help="comma-separated, from: %(default)s")
    p.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma-separated, from: %(default)s")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of every prompt on every system (rounds interleaved; a prompt's speedup is the median "
                        "of its rounds' ratios; default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="new tokens per answer (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1,
                   help="CPU threads (default: %(default)s)")
    p.add_argument("--ctx", type=positive_int, default=4096, help="context size (default: %(default)s)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="llama.cpp's repeat penalty over the last 64 tokens (specllm systems only; default: 1, off)")
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="GGUF path or registry name")
    p.add_argument("--specbench", type=Path, default=None, help="Spec-Bench questions (default: shared/specbench)")
    p.add_argument("--prompts", choices=tasks.PROMPT_SETS, default="dev",
                   help="dev: Spec-Bench dev half, HumanEval, prompts/code_edit.jsonl; fresh: prompts/fresh.jsonl, "
                        "holdout: prompts/holdout.jsonl, both for checking only (default: %(default)s)")
    p.add_argument("--lockstep", action="store_true",
                   help="advance the specllm systems one speculative step each in turn on every prompt (the other "
                        "systems run before them, per prompt): a ratio measured under the same load, much steadier "
                        "on a shared machine than prompt-by-prompt interleaving")
    p.add_argument("--reload-rounds", action="store_true",
                   help="rounds outer: every round runs all prompts, with the specllm systems loaded afresh in an "
                        "order rotated by one per round (on a machine where an LLM loaded later in a process runs "
                        "faster, bench/README stop 53, an even --repeat gives each system each place alike)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output folder")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1 (got {args.repeat})")
    args.task_names = checks.names_in(p, "--tasks", args.tasks, tasks.ALL_TASKS)
    args.system_names = checks.names_in(p, "--systems", args.systems, ALL_SYSTEMS)
    return args


def load_prompts(args) -> list:
    """The prompts of the run, read before any model loads (else fail())."""
    try:
        prompts = tasks.load_tasks(args.task_names, args.limit, args.specbench, args.prompts, skip=args.skip)
    except tasks.PromptError as e:
        checks.fail(str(e))
    if not prompts:
        checks.fail(f"no prompts to run: --tasks {args.tasks} --prompts {args.prompts} --skip {args.skip} "
                    "leave none (a smaller --skip, or other tasks)")
    return prompts


def resolve_model(name_or_path: str, flag: str = "--target") -> str:
    """An existing file as is, else a registry name (python/specllm/registry.py, loaded without the extension),
    pulled if missing; fail() for a path that is not a file or an unknown name."""
    if os.path.isfile(name_or_path):
        return os.path.abspath(name_or_path)
    spec = importlib.util.spec_from_file_location("_specllm_registry", REPO / "python" / "specllm" / "registry.py")
    registry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(registry)
    try:
        path = registry.resolve(name_or_path)
    except registry.RegistryError as e:
        checks.fail(f"{flag} {name_or_path}: {e}")
    if not os.path.isfile(path):
        checks.fail(f"{flag} {name_or_path}: {'a folder, not' if os.path.isdir(path) else 'no such'} model file "
                    "(give a GGUF path or a registry name)")
    return path


def make_templater(systems: list, target: str):
    """messages -> prompt text through the target's chat template (specllm's if loaded, else llama-cpp-python's:
    both render the GGUF's Jinja template since 2026-11-26)."""
    specllm_systems = [s for s in systems if isinstance(s, SpecllmSystem)]
    if specllm_systems:  # the first still loaded (--reload-rounds may drop one)
        return lambda messages: next(s.llm for s in specllm_systems if s.llm is not None).apply_chat_template(
            messages, add_generation_prompt=True)
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    vocab = Llama(target, vocab_only=True, verbose=False)
    piece = lambda t: vocab.detokenize([t], special=True).decode("utf-8", errors="replace")  # noqa: E731
    fmt = Jinja2ChatFormatter(vocab.metadata["tokenizer.chat_template"], eos_token=piece(vocab.token_eos()),
                              bos_token=piece(vocab.token_bos()), add_generation_prompt=True)
    return lambda messages: fmt(messages=messages).prompt


def load_systems(names: list, cfg: Config, notes: list) -> tuple[list, dict]:
    """Load every system and run its warm-up (excluded); a system that fails is dropped with a note."""
    systems, load_ms = [], {}
    for name in names:
        try:
            system = make_system(name, cfg)
            load_ms[name] = system.load()
            print(f"loaded {name} in {load_ms[name]:.0f} ms", file=sys.stderr)
            systems.append(system)
        except Exception as e:  # a configuration the installed specllm does not have yet, a failed build, ...
            notes.append(f"system {name} skipped: {type(e).__name__}: {e}")
            print(notes[-1], file=sys.stderr)
    return systems, load_ms


def reload_specllm(systems: list, rep: int, template, notes: list) -> list:
    """The systems with the specllm ones closed and loaded again, in their order rotated by `rep` (--reload-rounds),
    each warmed up as at the start; the others as they were. Their place in `systems` (and so in every prompt's
    order) stays."""
    specllm_systems = [s for s in systems if isinstance(s, SpecllmSystem)]
    for system in specllm_systems:
        system.llm.close()
        system.llm = None
        system._memory_for = (None, None, None)  # a new LLM starts from an empty memory, as round 0 did
    gc.collect()
    failed = set()
    for system in report.rotate(specllm_systems, rep):
        try:
            system.load()
        except Exception as e:
            notes.append(f"system {system.name} dropped at round {rep + 1}: {type(e).__name__}: {e}")
            print(notes[-1], file=sys.stderr)
            failed.add(system.name)
    for system in specllm_systems:
        if system.name not in failed and not warm_up([system], template, notes):
            failed.add(system.name)
    return [s for s in systems if s.name not in failed]


def warm_up(systems: list, template, notes: list) -> list:
    kept = []
    for system in systems:
        try:
            system.run(template([{"role": "user", "content": WARMUP_MESSAGE}]), WARMUP_TOKENS)
            kept.append(system)
        except Exception as e:
            notes.append(f"system {system.name} skipped (warm-up failed): {type(e).__name__}: {e}")
            print(notes[-1], file=sys.stderr)
    return kept


def run_turns(system, prompt: tasks.Prompt, template, max_tokens: int, rep: int = 0, stepwise: bool = False):
    """All turns of one prompt on one system (round `rep`); each later turn carries the system's own earlier
    answers. A generator that returns the records; stepwise: it yields after every speculative step."""
    messages, records = [], []
    for turn, user in enumerate(prompt.turns):
        messages.append({"role": "user", "content": user})
        if stepwise:
            result = yield from system.steps(template(messages), max_tokens, keep_cache=turn > 0)
        else:
            result = system.run(template(messages), max_tokens, keep_cache=turn > 0)
        records.append({"system": system.name, "task": prompt.task, "id": prompt.id, "turn": turn, "rep": rep,
                        **asdict(result)})
        messages.append({"role": "assistant", "content": result.text})
    return records


def run_prompt(system, prompt: tasks.Prompt, template, max_tokens: int, rep: int = 0) -> list[dict]:
    records = run_in_lockstep([system], prompt, template, max_tokens, rep, stepwise=False)[system.name]
    if isinstance(records, Exception):
        raise records
    return records


def run_in_lockstep(systems: list, prompt: tasks.Prompt, template, max_tokens: int, rep: int = 0,
                    stepwise: bool = True) -> dict:
    """One prompt on several specllm systems advanced one speculative step each in turn, so that a burst of load
    on a shared machine slows them alike (per-prompt interleaving leaves minutes between a system and its
    reference). {system name: records, or the exception it failed with}."""
    running = {s.name: run_turns(s, prompt, template, max_tokens, rep, stepwise) for s in systems}
    out = {}
    while running:
        for name, gen in list(running.items()):
            try:
                next(gen)
            except StopIteration as done:
                out[name] = done.value
                del running[name]
            except Exception as e:
                out[name] = e
                del running[name]
    return out


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"machine": re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()), "cpu": cpu,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def versions() -> dict:
    out = {}
    for mod in ("specllm", "llama_cpp"):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "?")
        except ImportError:
            out[mod] = None
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.repeat_penalty != 1.0 and any(n not in SPECLLM_SYSTEMS for n in args.system_names):
        print("error: --repeat-penalty applies to specllm's systems only", file=sys.stderr)
        return 2
    prompts = load_prompts(args)
    checks.out_dir(args.out)
    return checks.measured(lambda started: measure(args, prompts, started))


def measure(args, prompts: list, started) -> int:
    """Load the systems, run the prompts, write the results; started(path) is told the records log's path."""
    names = args.system_names
    cfg = Config(resolve_model(args.target), resolve_model(args.draft, "--draft") if args.draft else "", args.ctx,
                 args.threads, args.temperature, args.repeat_penalty)
    notes = []
    systems, load_ms = load_systems(names, cfg, notes)
    if not systems:
        checks.fail("no system could run (see above)")
    try:
        template = make_templater(systems, cfg.target)
    except Exception as e:  # llama-cpp-python missing, or the model unreadable by it
        checks.fail(f"cannot render the prompts with {cfg.target}'s chat template: {type(e).__name__}: {e}")
    systems = warm_up(systems, template, notes)
    if not systems:
        checks.fail("no system could run (see above)")
    meta = {**machine_info(), "date": datetime.date.today().isoformat(), "target": cfg.target, "draft": cfg.draft,
            "max_tokens": args.max_tokens, "temperature": args.temperature, "repeat_penalty": args.repeat_penalty,
            "threads": args.threads,
            "ctx": args.ctx, "limit": args.limit, "skip": args.skip, "repeat": args.repeat, "lockstep": args.lockstep, "reload_rounds": args.reload_rounds, "tasks": args.tasks, "prompts": args.prompts,
            "systems": [s.name for s in systems],
            "load_ms": load_ms, "reference": "plain", "versions": versions(), "notes": notes,
            "chat_template": "jinja"}  # prompts rendered by the model's Jinja template (bench.oracle.chat_template_of)
    log_path = checks.records_log(args.out, f"{meta['date']}-{meta['machine']}", started)
    records, t_start = [], time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:  # survives a crash mid-run
        def keep(name: str, new) -> None:
            if isinstance(new, Exception):
                notes.append(f"{name} failed on {prompt.task}/{prompt.id}: {type(new).__name__}: {new}")
                print(notes[-1], file=sys.stderr)
                return
            records.extend(new)
            log.writelines(json.dumps(r) + "\n" for r in new)
            log.flush()

        def run_one(i: int, prompt, rep: int) -> None:
            order = report.rotate(systems, i * args.repeat + rep)
            together = [s for s in order if args.lockstep and isinstance(s, SpecllmSystem)]
            for system in [s for s in order if s not in together]:
                try:
                    new = run_prompt(system, prompt, template, args.max_tokens, rep)
                except Exception as e:
                    new = e
                keep(system.name, new)
            if together:
                for name, new in run_in_lockstep(together, prompt, template, args.max_tokens, rep).items():
                    keep(name, new)

        if args.reload_rounds:
            for rep in range(args.repeat):
                if rep > 0:
                    systems = reload_specllm(systems, rep, template, notes)
                for i, prompt in enumerate(prompts):
                    run_one(i, prompt, rep)
                print(f"[round {rep + 1}/{args.repeat}] {len(prompts)} prompts "
                      f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
        else:
            for i, prompt in enumerate(prompts):
                for rep in range(args.repeat):
                    run_one(i, prompt, rep)
                print(f"[{i + 1}/{len(prompts)}] {prompt.task}/{prompt.id} "
                      f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
    if not records:
        checks.nothing_measured(log_path, "every generation failed")
    summary = report.summarize(records, [s.name for s in systems], args.max_tokens)
    meta["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    checks.write_results(log_path, report.outputs(meta, summary, records))
    print(report.markdown(summary, meta))
    return 0


if __name__ == "__main__":
    checks.sigterm_exits()
    sys.exit(main())
