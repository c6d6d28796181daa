"""A results file's speedups again, with specllm's answers counted as the llama.cpp tools count theirs (bench.run
does so since 2026-12-08): an answer that ended on its own (fewer tokens than --max-tokens) counts its
end-of-generation token, whose step was timed. The per-task table before and after, for files written before.

    python -m bench.recount bench/results/vs-llama.cpp-2-rounds/2026-11-23-vm.json
"""
from __future__ import annotations

import argparse

from bench import report, results_file

ANCHORS = ("llama.cpp", "llama-cpp-python")  # counted by the tools' own figures


def recounted(records: list, max_tokens: int) -> list:
    out = []
    for r in records:
        r = dict(r)
        if not r["system"].startswith(ANCHORS) and 0 < r.get("n_gen", 0) < max_tokens and r.get("gen_tps"):
            r["gen_tps"] *= (r["n_gen"] + 1) / r["n_gen"]
        out.append(r)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a bench.run results .json")
    args = ap.parse_args(argv)
    data = results_file.load(args.results)
    meta, records = data["meta"], data["records"]
    before = report.summarize(records, meta["systems"], meta["max_tokens"])
    after = report.summarize(recounted(records, meta["max_tokens"]), meta["systems"], meta["max_tokens"])
    tasks = list(before["plain"])
    print("| system | " + " | ".join(tasks) + " |")
    print("|---|" + "---:|" * len(tasks))
    for system in before:
        if system == "plain":
            continue
        cells = [f"{before[system][t]['speedup']:.2f} → {after[system][t]['speedup']:.2f}"
                 if t in before[system] and before[system][t]["speedup"] else "-" for t in tasks]
        print(f"| {system} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
