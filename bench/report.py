"""Statistics over benchmark records, and the JSON / Markdown / PNG outputs.

A record is one generation: {"system", "task", "id", "turn", "rep", "text", "n_gen", "gen_tps", "prompt_ms",
"n_drafted", "n_accepted", "n_steps", "load_ms"}. Speedups are paired: for each prompt (task, id, turn) the
system's tokens/s over the reference's on that very prompt (in the same round when prompts are repeated, then the
median over the rounds), then the median of those ratios, so machine drift cancels.
"""
from __future__ import annotations

import io
import json
import statistics
import warnings

OVERALL = "overall"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rotate(items: list, i: int) -> list:
    """The order in which prompt i runs the systems: shifted by one per prompt, so drift hits all alike."""
    if not items:
        return []
    k = i % len(items)
    return items[k:] + items[:k]


def outputs_match(ref: dict, rec: dict, max_tokens: int) -> bool:
    """Same greedy output: identical text, or, when both stopped at the token limit, one a prefix of the other
    (tools count the limit slightly differently, e.g. one token more)."""
    a, b = ref["text"].strip(), rec["text"].strip()
    if a == b:
        return True
    at_limit = ref["n_gen"] >= max_tokens - 1 and rec["n_gen"] >= max_tokens - 1
    return at_limit and (a.startswith(b) or b.startswith(a))


def _key(rec: dict) -> tuple:
    """A prompt's turn in one round (--repeat): records of one key are paired across systems."""
    return rec["task"], rec["id"], rec["turn"], rec.get("rep", 0)


def paired_speedups(paired: list) -> list:
    """One ratio per prompt turn: tokens/s over the reference's in the same round, median over the rounds."""
    by_prompt: dict = {}
    for r, ref in paired:
        if r["gen_tps"] and ref["gen_tps"]:
            by_prompt.setdefault(_key(r)[:3], []).append(r["gen_tps"] / ref["gen_tps"])
    return [median(v) for v in by_prompt.values()]


def round_speedups(paired: list) -> list:
    """Per round (--repeat), the median over prompt turns of that round's ratios: the spread of the speedup."""
    by_round: dict = {}
    for r, ref in paired:
        if r["gen_tps"] and ref["gen_tps"]:
            by_round.setdefault(r.get("rep", 0), []).append(r["gen_tps"] / ref["gen_tps"])
    return [median(by_round[k]) for k in sorted(by_round)]


def summarize_group(recs: list, refs: dict, max_tokens: int) -> dict:
    """Stats of one system's records (one task or all); refs maps prompt key -> reference record."""
    paired = [(r, refs[_key(r)]) for r in recs if _key(r) in refs]
    ratios = paired_speedups(paired)
    rounds = round_speedups(paired)
    n_drafted = sum(r["n_drafted"] for r in recs)
    n_accepted = sum(r["n_accepted"] for r in recs)
    n_steps = sum(r["n_steps"] for r in recs)
    return {
        "n": len(recs),
        "gen_tps": median(r["gen_tps"] for r in recs),
        "speedup": median(ratios),
        "speedup_rounds": rounds,  # one figure per round: the error bars of the chart
        "acceptance_rate": n_accepted / n_drafted if n_drafted else None,
        "accepted_per_step": n_accepted / n_steps if n_steps else None,
        "match_rate": sum(outputs_match(ref, r, max_tokens) for r, ref in paired) / len(paired) if paired else None,
        "prompt_ms": median(r["prompt_ms"] for r in recs),
        "load_ms": median(r.get("load_ms") for r in recs),
        "n_gen_mean": sum(r["n_gen"] for r in recs) / len(recs) if recs else None,
    }


def summarize(records: list, systems: list, max_tokens: int, reference: str = "plain") -> dict:
    """{system: {task or "overall": stats}} for every system with records."""
    tasks = list(dict.fromkeys(r["task"] for r in records))
    refs = {_key(r): r for r in records if r["system"] == reference}
    out = {}
    for system in systems:
        recs = [r for r in records if r["system"] == system]
        if not recs:
            continue
        out[system] = {task: summarize_group([r for r in recs if r["task"] == task], refs, max_tokens)
                       for task in tasks if any(r["task"] == task for r in recs)}
        out[system][OVERALL] = summarize_group(recs, refs, max_tokens)
    return out


def _fmt(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


# per-task tables of the Markdown report: (title, stats key, format)
TASK_TABLES = (
    ("Speedup over specllm `{reference}` (median of per-prompt tokens/s ratios)", "speedup", ".2f"),
    ("Generation tokens/s (median)", "gen_tps", ".1f"),
    ("Acceptance rate (accepted / drafted tokens)", "acceptance_rate", ".1%"),
    ("Accepted draft tokens per step", "accepted_per_step", ".2f"),
    ("Output match with specllm `{reference}` (greedy)", "match_rate", ".0%"),
)


def _task_table(summary: dict, key: str, spec: str) -> list[str]:
    systems = list(summary)
    tasks = list(dict.fromkeys(t for s in summary.values() for t in s))
    lines = ["| task | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    for task in tasks:
        cells = (_fmt(summary[s].get(task, {}).get(key), spec) for s in systems)
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines


def markdown(summary: dict, meta: dict) -> str:
    reference = meta.get("reference", "plain")
    lines = [f"# specllm benchmark — {meta.get('date', '')} on {meta.get('machine', '')}", "",
             f"Target `{meta.get('target')}`, draft `{meta.get('draft')}`, max tokens {meta.get('max_tokens')}, "
             f"temperature {meta.get('temperature')}, "
             + (f"repeat penalty {meta['repeat_penalty']}, " if meta.get("repeat_penalty", 1.0) != 1.0 else "")
             + f"threads {meta.get('threads')}, "
             f"{meta.get('limit') or 'all'} prompts per task"
             + (f" of the {meta['prompts']} set (bench/prompts/{meta['prompts']}.jsonl)"
                if meta.get("prompts") not in (None, "dev") else "")
             + (f", each run {meta['repeat']} times" if (meta.get("repeat") or 1) > 1 else "")
             + ("; the specllm systems in lockstep (one speculative step each in turn)" if meta.get("lockstep") else "")
             + f"; CPU: {meta.get('cpu', '?')}."]
    for title, key, spec in TASK_TABLES:
        lines += ["", "## " + title.format(reference=reference), ""] + _task_table(summary, key, spec)
    lines += ["", "## Overall, per system", "",
              "| system | tok/s | speedup | acceptance | accepted/step | output match | prompt ms | load ms |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s, stats in summary.items():
        o = stats[OVERALL]
        load_ms = o["load_ms"] if o["load_ms"] is not None else (meta.get("load_ms") or {}).get(s)
        lines.append(f"| {s} | {_fmt(o['gen_tps'], '.1f')} | {_fmt(o['speedup'], '.2f')} | "
                     f"{_fmt(o['acceptance_rate'], '.1%')} | {_fmt(o['accepted_per_step'], '.2f')} | "
                     f"{_fmt(o['match_rate'], '.0%')} | {_fmt(o['prompt_ms'], '.0f')} | {_fmt(load_ms, '.0f')} |")
    notes = meta.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def chart(summary: dict, reference: str = "plain") -> bytes:
    """A PNG of grouped bars: speedup per task (and overall) for every system but the reference; with several rounds,
    the error bars span the rounds' speedups (each the median over that round's prompts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in summary if s != reference]
    tasks = list(dict.fromkeys(t for s in summary.values() for t in s))
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(tasks)), 4.5))
    for j, system in enumerate(systems):
        stats = [summary[system].get(t, {}) for t in tasks]
        ys = [st.get("speedup") or 0.0 for st in stats]
        rounds = [st.get("speedup_rounds") or [] for st in stats]
        yerr = None
        if any(len(r) > 1 for r in rounds):
            yerr = [[max(0.0, y - min(r)) if len(r) > 1 else 0.0 for y, r in zip(ys, rounds)],
                    [max(0.0, max(r) - y) if len(r) > 1 else 0.0 for y, r in zip(ys, rounds)]]
        ax.bar([i + (j - (len(systems) - 1) / 2) * width for i in range(len(tasks))], ys, width, label=system,
               yerr=yerr, capsize=2, error_kw={"linewidth": 0.8})
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=20)
    ax.set_ylabel(f"speedup over specllm {reference}")
    if systems:  # the reference alone has no bars (and an empty legend warns)
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    return png.getvalue()


def outputs(meta: dict, summary: dict, records: list) -> dict:
    """{"json", "md", "png"}: the results of a run, for checks.write_all / write_results (the chart left out, with a
    warning, without matplotlib)."""
    out = {"json": json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1),
           "md": markdown(summary, meta)}
    try:
        out["png"] = chart(summary, meta.get("reference", "plain"))
    except ImportError:
        warnings.warn("matplotlib is not installed: no PNG chart (pip install matplotlib, or specllm[bench])")
    return out
