"""The multi-call benchmark's statistics and report (bench/multicall.py runs it): per-request speed-ups over plain
decoding, their medians over requests 1-2 and 3+ of each sequence and of all, and the markdown tables."""
from __future__ import annotations

import os

from bench import report

FIRST = 2  # requests 1-2 of a sequence: the memory has little to offer yet; 3+ is where it should pay


# --- statistics

def _pair_key(r: dict) -> tuple:
    return r["sequence"], r["request"], r["rep"]


def per_request(records: list, system: str, max_tokens: int, reference: str = "plain") -> list[dict]:
    """One row per (sequence, request) of `system`: its speed-up over the reference (median over rounds), the
    wall-time speed-up, whether the texts matched in every round, and the summed counters."""
    refs = {_pair_key(r): r for r in records if r["system"] == reference}
    rows: dict = {}
    for r in records:
        if r["system"] != system:
            continue
        row = rows.setdefault((r["sequence"], r["request"]), {
            "sequence": r["sequence"], "request": r["request"], "ratios": [], "wall_ratios": [], "matches": [],
            "gen_tps": [], "n_drafted": 0, "n_accepted": 0, "n_steps": 0, "n_memory_steps": 0})
        row["gen_tps"].append(r["gen_tps"])
        for k in ("n_drafted", "n_accepted", "n_steps", "n_memory_steps"):
            row[k] += r[k]
        ref = refs.get(_pair_key(r))
        if ref is None:
            continue
        if r["gen_tps"] and ref["gen_tps"]:
            row["ratios"].append(r["gen_tps"] / ref["gen_tps"])
        if r["wall_s"] and ref["wall_s"]:
            row["wall_ratios"].append(ref["wall_s"] / r["wall_s"])
        row["matches"].append(report.outputs_match(ref, r, max_tokens))
    out = []
    for row in rows.values():
        row["speedup"] = report.median(row.pop("ratios"))
        row["wall_speedup"] = report.median(row.pop("wall_ratios"))
        matches = row.pop("matches")
        row["same_text"] = all(matches) if matches else None
        row["gen_tps"] = report.median(row["gen_tps"])
        out.append(row)
    return out


def summarize_rows(rows: list) -> dict:
    """Speed-ups over requests 1-2 and 3+ (medians), same-text share, acceptance, memory steps."""
    first = [r for r in rows if r["request"] < FIRST]
    later = [r for r in rows if r["request"] >= FIRST]
    drafted, accepted = sum(r["n_drafted"] for r in rows), sum(r["n_accepted"] for r in rows)
    steps = sum(r["n_steps"] for r in rows)
    compared = [r["same_text"] for r in rows if r["same_text"] is not None]
    return {
        "n_requests": len(rows),
        "gen_tps": report.median(r["gen_tps"] for r in rows),
        "speedup_first": report.median(r["speedup"] for r in first),
        "speedup_later": report.median(r["speedup"] for r in later),
        "wall_speedup_first": report.median(r["wall_speedup"] for r in first),
        "wall_speedup_later": report.median(r["wall_speedup"] for r in later),
        "same_text": sum(compared) / len(compared) if compared else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "n_drafted": drafted, "n_accepted": accepted, "n_steps": steps,
        "n_memory_steps": sum(r["n_memory_steps"] for r in rows),
    }


def summarize(records: list, systems: list[str], sequences: list, max_tokens: int) -> dict:
    """{"overall": {system: stats}, "sequences": {id: {system: stats}}, "by_request": {system: [speed-up of
    request i, median over sequences]}, "requests": {system: per-request rows}}."""
    out = {"overall": {}, "sequences": {s.id: {} for s in sequences}, "by_request": {}, "requests": {}}
    n_max = max((len(s.requests) for s in sequences), default=0)
    for system in systems:
        rows = per_request(records, system, max_tokens)
        if not rows:
            continue
        out["requests"][system] = rows
        out["overall"][system] = summarize_rows(rows)
        for s in sequences:
            mine = [r for r in rows if r["sequence"] == s.id]
            if mine:
                out["sequences"][s.id][system] = summarize_rows(mine)
        out["by_request"][system] = [report.median(r["speedup"] for r in rows if r["request"] == i)
                                     for i in range(n_max)]
    return out


# --- report

def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def markdown(summary: dict, meta: dict, sequences: list) -> str:
    others = [s for s in meta["systems"] if s != "plain" and s in summary["overall"]]
    lines = [f"# specllm multi-call bench, {meta['date']} on {meta['machine']}", "",
             f"`{meta['command']}`", "",
             f"Target `{os.path.basename(meta['target'])}`, draft `{os.path.basename(meta['draft'] or 'none')}`, "
             f"greedy, max tokens {meta['max_tokens']}, threads {meta['threads']}, {len(sequences)} sequences, "
             f"{meta['repeat']} round(s), {meta['elapsed_s']:.0f} s; memory_tokens per system: "
             + ", ".join(f"{k} {v}" for k, v in meta["memory_tokens"].items()) + f"; CPU: {meta['cpu']}."
             + (" Rounds outer, the systems loaded afresh each round, in the orders "
                + "; ".join(", ".join(o) for o in meta["load_order"]) + "." if meta.get("reload_rounds") else ""), "",
             ("Speed-up: tokens/s (prefill excluded) over `plain`'s on the same request, median over requests; "
              "wall: plain's wall time (prefill included) over the system's. Goal (issue 15): memory-on >= 1.5x on "
              "requests 3+."), "",
             "## Overall", "",
             ("| system | tok/s | requests 1-2 | requests 3+ | wall 1-2 | wall 3+ | acceptance | memory steps / steps "
              "| same text as plain |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, o in summary["overall"].items():
        mem = f"{o['n_memory_steps']} / {o['n_steps']}"
        lines.append(f"| {name} | {_f(o['gen_tps'], '.1f')} | {_f(o['speedup_first'], '.2f')} | "
                     f"{_f(o['speedup_later'], '.2f')} | {_f(o['wall_speedup_first'], '.2f')} | "
                     f"{_f(o['wall_speedup_later'], '.2f')} | {_f(o['acceptance_rate'], '.0%')} | {mem} | "
                     f"{_f(o['same_text'] if name != 'plain' else None, '.0%')} |")
    lines += ["", "## Per sequence (speed-up over plain: requests 1-2 / 3+)", "",
              "| sequence | kind | mode | requests | plain tok/s | " + " | ".join(others) + " |",
              "|---|---|---|---:|---:|" + "---:|" * len(others)]
    for s in sequences:
        st = summary["sequences"].get(s.id, {})
        cells = []
        for name in others:
            o = st.get(name)
            cells.append("–" if o is None else f"{_f(o['speedup_first'], '.2f')} / {_f(o['speedup_later'], '.2f')}")
        plain_tps = st.get("plain", {}).get("gen_tps")
        lines.append(f"| {s.id} | {s.kind} | {s.mode} | {len(s.requests)} | {_f(plain_tps, '.1f')} | "
                     + " | ".join(cells) + " |")
    lines += ["", "## Per sequence: acceptance, memory steps, same text as plain", "",
              "| sequence | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
    for s in sequences:
        st = summary["sequences"].get(s.id, {})
        cells = []
        for name in others:
            o = st.get(name)
            if o is None:
                cells.append("–")
                continue
            cells.append(f"{_f(o['acceptance_rate'], '.0%')}, {o['n_memory_steps']}/{o['n_steps']} steps, "
                         f"{_f(o['same_text'], '.0%')}")
        lines.append(f"| {s.id} | " + " | ".join(cells) + " |")
    n_max = max((len(s.requests) for s in sequences), default=0)
    lines += ["", "## By position in the sequence (speed-up, median over sequences)", "",
              "| request | sequences | " + " | ".join(others) + " |", "|---:|---:|" + "---:|" * len(others)]
    for i in range(n_max):
        cells = [_f(summary["by_request"].get(name, [None] * n_max)[i], ".2f") for name in others]
        lines.append(f"| {i + 1} | {sum(len(s.requests) > i for s in sequences)} | " + " | ".join(cells) + " |")
    if meta["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in meta["notes"]]
    return "\n".join(lines) + "\n"
