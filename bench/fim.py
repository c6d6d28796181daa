"""Fill in the middle, as an editor asks for it: holes cut out of real source files (specllm's own, which no model
was trained on), the text before the hole as the prompt and the text after it as the suffix
(generate(prefix, suffix=...)). Each hole starts at the beginning of a line inside a function and spans the
function's next few lines; the model writes the middle and ends it where it meets the suffix. Systems interleaved
per hole and round: plain decoding and the default (or those named). Reported per hole: the speed-up over plain
decoding (tokens per second of generation, prompt processing left out, the median over rounds: in fast mode a
system may write another text than plain decoding where two tokens nearly tie, of another length), tokens written, whether the
default wrote plain decoding's text, and whether the middle matched the hole's own text.

    python -m bench.fim                              # 12 holes, 3 rounds, plain against the default
    python -m bench.fim --holes 6 --rounds 2 --systems plain,default,ngram
"""
from __future__ import annotations

import argparse
import random
import re
import statistics
from pathlib import Path

from bench.checks import positive_int

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["python/specllm/stream.py", "python/specllm/memory.py", "python/specllm/registry.py",
           "python/specllm/chat_session.py", "python/specllm/server/tools.py", "python/specllm/server/worker.py",
           "cpp/src/ngram.cpp", "cpp/src/text.cpp", "cpp/src/prompt_store.cpp", "cpp/src/verifier.cpp",
           "bench/report.py", "bench/spread.py"]
SYSTEMS = {"plain": dict(draft=None), "default": dict(), "ngram": dict(draft="ngram")}
_DEF = re.compile(r"^(\s*def |[A-Za-z].*\)\s*(const\s*)?\{\s*$)")


def holes(n: int, seed: int = 0, context_lines: int = 60) -> list[dict]:
    """n holes, one per source file in turn: a line inside a function's body (not its first), the 2-5 lines from
    it cut out; the prefix and suffix are at most context_lines lines each side."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        path = SOURCES[i % len(SOURCES)]
        lines = (REPO / path).read_text(encoding="utf-8").splitlines(keepends=True)
        starts = [j for j, line in enumerate(lines) if _DEF.match(line)]
        for _ in range(100):
            j = rng.choice(starts) + rng.randint(2, 4)
            k = j + rng.randint(2, 5)
            if k < len(lines) and all(line.strip() for line in lines[j:k]):
                break
        indent = len(lines[j]) - len(lines[j].lstrip())
        prefix = "".join(lines[max(0, j - context_lines):j]) + lines[j][:indent]  # the cursor after the indent
        out.append({"id": f"{Path(path).name}:{j + 1}", "prefix": prefix, "middle": "".join(lines[j:k])[indent:],
                    "suffix": "".join(lines[k:k + context_lines])})
    return out


def main(argv=None) -> None:
    import specllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--holes", type=positive_int, default=12)
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--max-tokens", type=positive_int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="which holes (default: %(default)s)")
    ap.add_argument("--systems", default="plain,default", help=f"comma-separated, from {','.join(SYSTEMS)}")
    args = ap.parse_args(argv)
    names = args.systems.split(",")
    if "plain" not in names or any(n not in SYSTEMS for n in names):
        ap.error(f"--systems: plain and any of {', '.join(SYSTEMS)}")
    llms = {n: specllm.LLM(args.model, n_threads=args.threads, n_ctx=8192, memory_tokens=0, **SYSTEMS[n])
            for n in names}  # no drafting memory: each hole drafts from its own file only
    runs = {}
    for r in range(args.rounds):
        for h in holes(args.holes, args.seed):
            for n, llm in llms.items():  # later rounds find the prompt in the prompt cache: its time is not counted
                c = llm.generate(h["prefix"], suffix=h["suffix"], max_tokens=args.max_tokens)
                runs.setdefault(h["id"], {}).setdefault(n, []).append(c)
                s = c.stats
                print(f"round {r} {h['id']} {n}: {s.n_generated} tokens in {s.generate_ms:.0f} ms "
                      f"({s.tokens_per_second:.1f} tok/s), {s.n_accepted}/{s.n_drafted} drafted accepted, "
                      f"prompt {s.n_prompt}", flush=True)
    print(f"\n{'hole':<24} {'tokens':>6} " + " ".join(f"{n:>8}" for n in names[1:]) +
          "  same text as plain  middle as in the file")
    ratios = {n: [] for n in names[1:]}
    by_hole = {h["id"]: h for h in holes(args.holes, args.seed)}
    for hid, got in runs.items():
        plain = got["plain"]
        row = []
        for n in names[1:]:
            ratio = statistics.median(c.stats.tokens_per_second / p.stats.tokens_per_second  # texts may differ
                                      for p, c in zip(plain, got[n]) if p.stats.tokens_per_second > 0)
            ratios[n].append(ratio)
            row.append(f"{ratio:8.2f}")
        same = all(c.text == p.text for n in names[1:] for p, c in zip(plain, got[n]))
        exact = plain[0].text.strip() == by_hole[hid]["middle"].strip()
        print(f"{hid:<24} {plain[0].stats.n_generated:>6} " + " ".join(row) + f"  {str(same):>18}  {exact}")
    for n, rs in ratios.items():
        print(f"{n}: median speed-up over plain decoding {statistics.median(rs):.2f} "
              f"(holes: min {min(rs):.2f}, max {max(rs):.2f}; geometric mean "
              f"{statistics.geometric_mean(rs):.3f})")


if __name__ == "__main__":
    main()
