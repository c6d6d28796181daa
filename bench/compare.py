"""Two runs of bench.run on the same prompts: did the system decide the same, and how far apart are its speed-ups?

    python -m bench.compare bench/results/fresh-lockstep/2026-11-23-vm.json \\
        bench/results/fresh-lockstep-again/2026-11-23-vm.json [--system hybrid] [--system-b NAME]

Per (prompt, turn, round): the same steps, drafted and accepted tokens and text in both runs? Per prompt and turn:
the median speed-up over the reference (plain) in each run, and their difference; then the median and largest
|difference| and how many are within 0.05 (issue 15's stability goal), and the per-task speed-ups of both runs.
--system-b: run b's system, where it ran under another name (the same settings, or the one compared with).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys

from bench.report import _key
from bench.results_file import ResultsError, load

DECISION = ("n_steps", "n_drafted", "n_accepted", "text")


def _by_key(records: list) -> dict:
    by = collections.defaultdict(dict)
    for r in records:
        by[_key(r)][r["system"]] = r
    return by


def compare(a: dict, b: dict, system: str, reference: str = "plain", system_b: str | None = None) -> dict:
    """{"same", "runs", "prompts": [(task, id, turn, speed-up a, speed-up b)], "median_diff", "max_diff",
    "within_005"}. system_b: the system of run b (default: the same; e.g. the same settings under a new name)."""
    system_b = system_b or system
    ra, rb = _by_key(a["records"]), _by_key(b["records"])
    keys = [k for k in ra if k in rb and system in ra[k] and system_b in rb[k]]
    same = sum(all(ra[k][system][f] == rb[k][system_b][f] for f in DECISION) for k in keys)
    ratios = {0: collections.defaultdict(list), 1: collections.defaultdict(list)}
    for k in keys:
        for i, (run, name) in enumerate(((ra, system), (rb, system_b))):
            x = run[k]
            if reference in x and x[reference]["gen_tps"] > 0:
                ratios[i][k[:3]].append(x[name]["gen_tps"] / x[reference]["gen_tps"])
    prompts = [(*k, statistics.median(ratios[0][k]), statistics.median(ratios[1][k]))
               for k in sorted(ratios[0]) if ratios[1].get(k)]
    diffs = [abs(p[3] - p[4]) for p in prompts]
    return {"same": same, "runs": len(keys), "prompts": prompts,
            "median_diff": statistics.median(diffs) if diffs else None, "max_diff": max(diffs) if diffs else None,
            "within_005": sum(d <= 0.05 + 1e-9 for d in diffs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--system", default="hybrid", help="the system compared (default: %(default)s)")
    p.add_argument("--system-b", default=None,
                   help="the system of the second run, if it ran the same settings under another name (default: "
                        "--system)")
    args = p.parse_args(argv)
    system_b = args.system_b or args.system
    try:
        a, b = (load(path, "records", system="plain") for path in (args.a, args.b))
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = compare(a, b, args.system, system_b=system_b)
    if not c["prompts"]:
        print(f"error: no (prompt, turn, round) of system {args.system} (and {system_b} in the second run) is in both "
              "runs beside a plain one", file=sys.stderr)
        return 1
    for task, pid, turn, x, y in c["prompts"]:
        print(f"{task:15s} {pid}:{turn}  {x:.2f}  {y:.2f}  {x - y:+.2f}")
    print(f"same decisions and text: {c['same']} of {c['runs']} runs; per prompt |difference| median "
          f"{c['median_diff']:.3f}, max {c['max_diff']:.3f}, {c['within_005']} of {len(c['prompts'])} within 0.05")
    sa, sb = (dict(run.get("summary") or {}).get(name) or {} for run, name in ((a, args.system), (b, system_b)))
    for task in sa:
        if task in sb and sa[task].get("speedup") is not None and sb[task].get("speedup") is not None:
            print(f"{task:15s} {sa[task]['speedup']:.2f}  {sb[task]['speedup']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
