"""An editor's completion session, as llama.vscode and llama.vim drive /infill: a hole cut out of a real source
file (bench.fim's holes), the cursor at its first line; the editor asks for the middle, the user accepts the
suggestion's first line (Shift+Tab) and the editor asks again at its end (--enter: the user goes on to the next
line, which the editor indents) -- up to --requests times per hole. A later request's middle is mostly what the
request before it wrote after its first line, which no n-gram of the prompt holds (it was never accepted) but the
drafting memory does: this measures whether the memory pays on that. The accepted lines are plain decoding's, so
every system is asked the same prompts (the repo-level form /infill builds, without other files' chunks). Systems
interleaved per request; the memory is cleared between rounds (a later round would find the same session in it),
kept across holes. Reported: tokens per second of generation (prompt processing left out) against plain
decoding, for first requests and for later ones.

    python -m bench.editor                               # 8 holes (--seed 3), up to 3 requests, 2 rounds
    python -m bench.editor --systems plain,default,no-memory --holes 4 --rounds 1

With --ring it measures the prompt instead: the plugins also send chunks of other files (a ring that drops its
oldest chunk as a new one comes in), before the prefix. Each request rotates the ring by one chunk and asks for
one hole's middle; an LLM with cache_reuse=256 (llama-server's --cache-reuse, as llama.vscode suggests) moves the
chunks that stayed instead of decoding them again. Reported per request: prompt processing time and tokens
decoded, with and without, and whether the middle is the one a fresh prompt gets.

    python -m bench.editor --ring                        # 6 chunks of 24 lines, 4 rotations
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench import checks
from bench.checks import positive_int
from bench.fim import holes

SYSTEMS = {"plain": dict(draft=None), "default": dict(), "no-memory": dict(memory_tokens=0),
           "ngram": dict(draft="ngram")}


def next_prefix(prefix: str, middle: str, enter: bool = False):
    """The prefix after the user accepted the middle's first line (Shift+Tab: the cursor stays at its end) or, with
    `enter`, went on to the next line, which the editor indented (None when the middle has no second line with
    text)."""
    lines = middle.split("\n")
    if len(lines) < 2 or not lines[1].strip():
        return None
    if not enter:
        return prefix + lines[0]
    return prefix + lines[0] + "\n" + lines[1][:len(lines[1]) - len(lines[1].lstrip())]


def main(argv=None) -> None:
    import specllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--holes", type=positive_int, default=8)
    ap.add_argument("--seed", type=int, default=3, help="which holes (bench.fim's --seed; default: %(default)s)")
    ap.add_argument("--context-lines", type=int, default=30)
    ap.add_argument("--requests", type=positive_int, default=3, help="requests per hole at most")
    ap.add_argument("--rounds", type=positive_int, default=2)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--max-tokens", type=positive_int, default=48)
    ap.add_argument("--systems", default="plain,default,no-memory", help=f"comma-separated, from {','.join(SYSTEMS)}")
    ap.add_argument("--enter", action="store_true",
                    help="after accepting a line the user presses Enter (the cursor after the next line's indent)")
    ap.add_argument("--out", help="write every request's numbers to this JSON file")
    ap.add_argument("--ring", action="store_true", help="measure the prompt of a rotating ring of chunks instead")
    ap.add_argument("--chunks", type=int, default=6, help="--ring: chunks in the ring (default: %(default)s)")
    ap.add_argument("--chunk-lines", type=int, default=24, help="--ring: lines per chunk (default: %(default)s)")
    ap.add_argument("--rotations", type=int, default=4, help="--ring: requests after the first (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.out:
        checks.out_dir(Path(args.out).resolve().parent, "--out's folder")
    if args.ring:
        return ring(args)
    names = args.systems.split(",")
    if names[0] != "plain" or any(n not in SYSTEMS for n in names):
        ap.error(f"--systems: plain first, then any of {', '.join(SYSTEMS)}")
    llms = {n: specllm.LLM(args.model, n_threads=args.threads, n_ctx=4096, **SYSTEMS[n]) for n in names}
    rows = []
    for r in range(args.rounds):
        for llm in llms.values():
            llm.clear_memory()
        for h in holes(args.holes, args.seed, args.context_lines):
            prefix = h["prefix"]
            for i in range(args.requests):
                prompt = llms["plain"].infill_prompt(prefix, h["suffix"], args.max_tokens, extra=[])
                got = {n: llm.generate(prompt, max_tokens=args.max_tokens) for n, llm in llms.items()}
                row = {"round": r, "hole": h["id"], "request": i,
                       **{n: {"tok_s": c.stats.tokens_per_second, "n": c.stats.n_generated,
                              "drafted": c.stats.n_drafted, "accepted": c.stats.n_accepted,
                              "memory_steps": c.stats.n_memory_steps, "same": c.text == got["plain"].text}
                          for n, c in got.items()}}
                rows.append(row)
                print(f"round {r} {h['id']} request {i}: " + ", ".join(
                    f"{n} {v['tok_s']:.1f} tok/s ({v['accepted']}/{v['drafted']}, {v['memory_steps']} memory steps)"
                    for n, v in row.items() if isinstance(v, dict)), flush=True)
                prefix = next_prefix(prefix, got["plain"].text, args.enter)
                if prefix is None:
                    break
    if args.out:
        checks.write_text(Path(args.out), json.dumps(rows, indent=1))
    report(rows, names)


def ring_chunks(n: int, lines: int) -> list:
    """(filename, text) chunks of `lines` lines from the repository's sources, in turn, as a plugin's ring holds
    them (llama.vscode: 16 chunks of 64 lines by default)."""
    from bench.fim import REPO, SOURCES

    out, i = [], 0
    while len(out) < n:
        path = SOURCES[i % len(SOURCES)]
        text = (REPO / path).read_text(encoding="utf-8").splitlines(keepends=True)
        start = (i // len(SOURCES)) * lines
        out.append((path, "".join(text[start:start + lines])))
        i += 1
    return out


def ring(args) -> None:
    import specllm

    hole = holes(1, args.seed, args.context_lines)[0]
    pool = ring_chunks(args.chunks + args.rotations, args.chunk_lines)
    llms = {"no reuse": specllm.LLM(args.model, n_threads=args.threads, n_ctx=8192, prompt_cache_mb=0),
            "cache_reuse=256": specllm.LLM(args.model, n_threads=args.threads, n_ctx=8192, prompt_cache_mb=0)}
    reuse = {"no reuse": 0, "cache_reuse=256": 256}
    rows = []
    for i in range(args.rotations + 1):
        extra = pool[i:i + args.chunks]
        prompt = llms["no reuse"].infill_prompt(hole["prefix"], hole["suffix"], 16, extra=extra)
        got = {n: llm.generate(prompt, max_tokens=16, cache_reuse=reuse[n]) for n, llm in llms.items()}
        row = {"request": i, "prompt": len(prompt), **{n: {"prefill_ms": c.stats.prefill_ms,
                                                           "decoded": c.stats.n_prompt - c.stats.n_cached,
                                                           "moved": c.stats.n_shifted, "text": c.text}
                                                       for n, c in got.items()}}
        rows.append(row)
        print(f"request {i}: {len(prompt)} prompt tokens; " + "; ".join(
            f"{n}: {v['decoded']} decoded ({v['moved']} moved) in {v['prefill_ms'] / 1000:.1f} s"
            for n, v in row.items() if isinstance(v, dict)) +
            f"; same middle: {got['no reuse'].text == got['cache_reuse=256'].text}", flush=True)
    if args.out:
        checks.write_text(Path(args.out), json.dumps(rows, indent=1))
    later = rows[1:]
    for n in llms:
        print(f"{n}: requests after the first, median prompt processing "
              f"{statistics.median(r[n]['prefill_ms'] for r in later) / 1000:.1f} s, "
              f"{statistics.median(r[n]['decoded'] for r in later):.0f} tokens decoded")
    print(f"same middle on {sum(r['no reuse']['text'] == r['cache_reuse=256']['text'] for r in rows)} of {len(rows)}")


def report(rows, names) -> None:
    """Median ratios over (hole, request) of the median over rounds, first requests and later ones apart."""
    by = {}
    for row in rows:
        by.setdefault((row["hole"], row["request"]), []).append(row)
    for label, first in (("first requests", True), ("later requests", False)):
        keys = [k for k in by if (k[1] == 0) == first]
        if not keys:
            continue
        print(f"\n{label} ({len(keys)}):")
        for n in names[1:]:
            ratios = [statistics.median(x[n]["tok_s"] / x["plain"]["tok_s"] for x in by[k] if x["plain"]["tok_s"] > 0)
                      for k in keys]
            same = sum(all(x[n]["same"] for x in by[k]) for k in keys)
            print(f"  {n:<10} median {statistics.median(ratios):.2f}x plain (min {min(ratios):.2f}, max "
                  f"{max(ratios):.2f}; geometric mean {statistics.geometric_mean(ratios):.3f}); plain's text on "
                  f"{same} of {len(keys)}")


if __name__ == "__main__":
    main()
