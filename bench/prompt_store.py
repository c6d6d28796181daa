"""What prompt states on disk (LLM(prompt_cache_dir=...)) save when a process starts again: an LLM answers a
question under a long system prompt (a source file as an agent's or editor's context) and is closed; a new LLM, as
a new process would, then (a) asks another question under the same system prompt, (b) takes the first chat up again
with a second turn. Reported per system (states on disk / none, interleaved per round): the new LLM's prompt
processing time (prefill_ms: its time to first token but one step), the prompt tokens it reused, and the bytes the
first LLM wrote. The replies of both systems are compared: a restored state is llama.cpp's own bytes, but in fast
mode the state-less system decodes the prompt's last batch with other rows beside it, which may round differently.

    python -m bench.prompt_store                    # the default pair, 3 rounds
    python -m bench.prompt_store --rounds 5 --file python/specllm/llm.py
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.checks import positive_int, readable_file


def main(argv=None) -> None:
    import specllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--file", type=readable_file, default="python/specllm/stream.py", help="the source file in the system prompt")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--max-tokens", type=positive_int, default=32)
    args = ap.parse_args(argv)
    source = open(args.file, encoding="utf-8").read()
    system = {"role": "system", "content": f"You answer questions about this file.\n\n{source}"}
    first_q = {"role": "user", "content": "What does the Gate class do?"}
    cases = {"new question": [system, {"role": "user", "content": "Which exceptions can a stream raise?"}],
             "second turn": None}  # the first chat and its reply, then another question
    root = Path(tempfile.mkdtemp(prefix="specllm-prompt-store-"))
    rows = {(case, name): [] for case in cases for name in ("disk", "none")}
    replies = {case: [] for case in cases}
    try:
        for r in range(args.rounds):
            for case in cases:
                got = {}
                for name in ("disk", "none"):
                    store = root / "states"
                    shutil.rmtree(store, ignore_errors=True)
                    kw = dict(n_threads=args.threads, n_ctx=8192)
                    if name == "disk":
                        kw["prompt_cache_dir"] = store
                    with specllm.LLM(args.model, **kw) as first:  # the process before the restart
                        one = first.chat([system, first_q], max_tokens=args.max_tokens)
                        written = first.prompt_cache_stored
                    messages = cases[case] or [system, first_q, {"role": "assistant", "content": one.text},
                                               {"role": "user", "content": "And what happens to a stream nobody "
                                                                           "advances?"}]
                    with specllm.LLM(args.model, **kw) as again:  # the process after it
                        reply = again.chat(messages, max_tokens=args.max_tokens)
                    s = reply.stats
                    rows[(case, name)].append({"prefill_ms": s.prefill_ms, "n_prompt": s.n_prompt,
                                               "n_cached": s.n_cached, "written_mb": written / 2 ** 20})
                    got[name] = reply.text
                    print(f"round {r} {case} {name}: {s.n_prompt} prompt tokens, {s.n_cached} reused "
                          f"(from disk: {s.restored_from_disk}), prefill {s.prefill_ms:.0f} ms; the first process "
                          f"wrote {written / 2 ** 20:.1f} MiB", flush=True)
                replies[case].append(got["disk"] == got["none"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nmedians over rounds:")
    for (case, name), rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(f"  {case}, {name}: prefill {med['prefill_ms']:.0f} ms of {med['n_prompt']:.0f} prompt tokens "
              f"({med['n_cached']:.0f} reused); written {med['written_mb']:.1f} MiB")
    for case, same in replies.items():
        print(f"{case}: the replies with and without states on disk equal in {sum(same)} of {len(same)} rounds")


if __name__ == "__main__":
    main()
