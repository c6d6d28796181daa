"""What the prompt cache saves when an assistant takes a conversation up again after another request: a chat about a
source file (its first turn), a title request for it (another prompt: the live KV cache is cut), then the chat's
second turn. Reported per system (prompt cache on / off, interleaved per round): the second turn's prompt
processing time (prefill_ms, its time to first token but one step), the tokens it reused, and the title request's
prefill (which pays for copying the chat's state out). A third system asks no title (its cache stays live): the
cache-on reply must equal it (a restored state is llama.cpp's own bytes). The cache-off reply may differ from both
in fast mode: it decodes the first reply's tokens again in a prompt batch, whose kernels round differently from the
steps that wrote them.

    python -m bench.prompt_cache                    # the default pair, 3 rounds
    python -m bench.prompt_cache --rounds 5 --file python/specllm/llm.py
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.checks import positive_int, readable_file


def main(argv=None) -> None:
    import specllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--file", type=readable_file, default="python/specllm/stream.py", help="the source file the chat is about")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--max-tokens", type=positive_int, default=48)
    args = ap.parse_args(argv)
    source = open(args.file, encoding="utf-8").read()
    on = specllm.LLM(args.model, n_threads=args.threads, n_ctx=8192)
    systems = {"cache-on": on,
               "cache-off": specllm.LLM(args.model, n_threads=args.threads, n_ctx=8192, prompt_cache_mb=0),
               "no-switch": on}
    rows = {name: [] for name in systems}
    replies = {}
    for r in range(args.rounds):
        for name, llm in systems.items():
            llm.reset(keep_memory=False)
            chat = [{"role": "user", "content": f"Here is a file:\n\n{source}\n\nWhat does the Gate class do?"}]
            first = llm.chat(chat, max_tokens=args.max_tokens)
            title = llm.chat([{"role": "user", "content": "Give a five-word title to a chat about a Python "
                                                           "stream gate."}], max_tokens=12) if name != "no-switch" else first
            chat += [{"role": "assistant", "content": first.text},
                     {"role": "user", "content": "And what happens to a stream nobody advances?"}]
            t0 = time.perf_counter()
            second = llm.chat(chat, max_tokens=args.max_tokens)
            wall = 1000 * (time.perf_counter() - t0)
            s = second.stats
            rows[name].append({"prefill_ms": s.prefill_ms, "n_prompt": s.n_prompt, "n_cached": s.n_cached,
                               "n_restored": s.n_restored, "title_prefill_ms": title.stats.prefill_ms,
                               "wall_ms": wall})
            replies.setdefault(r, {})[name] = second.text
            titled = f"title prefill {title.stats.prefill_ms:.0f} ms" if name != "no-switch" else "no title"
            print(f"round {r} {name}: second turn {s.n_prompt} prompt tokens, {s.n_cached} reused "
                  f"({s.n_restored} restored), prefill {s.prefill_ms:.0f} ms, whole reply {wall:.0f} ms; {titled}",
                  flush=True)
    print("\nmedians over rounds:")
    for name, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        titled = f"title prefill {med['title_prefill_ms']:.0f} ms" if name != "no-switch" else "no title"
        print(f"  {name}: second turn prefill {med['prefill_ms']:.0f} ms of {med['n_prompt']:.0f} prompt tokens "
              f"({med['n_cached']:.0f} reused), whole reply {med['wall_ms']:.0f} ms; {titled}")
    for other in ("no-switch", "cache-off"):
        same = sum(v["cache-on"] == v[other] for v in replies.values())
        print(f"second replies of cache-on and {other} equal in {same} of {len(replies)} rounds")


if __name__ == "__main__":
    main()
