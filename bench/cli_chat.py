"""Copy-heavy replies in a real terminal chat: `specllm-cli chat` in a pseudo-terminal, the default drafter against
plain decoding (`--draft none`), on edit requests whose reply restates the code it was given.

    python -m bench.cli_chat                       # every message, 2 rounds
    python -m bench.cli_chat --repeat 3 --max-tokens 256

Each (message, system, round) is one chat session started afresh (the model load is not timed): the message is
typed as a user types it, a ``` fence over several lines, then `/stats` is read back. Systems alternate per
message and round. Speed-up: the reply's tokens/s (the status line's, prefill excluded) over plain's in the same
round, median over rounds, then over messages. Results: bench/results/cli-chat/<date>-<host>.json and .md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
from pathlib import Path

from bench import checks
from bench.checks import names_in, positive_int
from bench.run import machine_info, resolve_model

REPO = Path(__file__).resolve().parent.parent
PROMPT = ">>> "
TIMEOUT = 600  # seconds for one reply on a busy 2-core machine

# edit requests on real-shaped functions: the reply restates most of the code
MESSAGES = {
    "type-hints": (
        "Add type hints and a docstring to this function:",
        '''def merge_settings(defaults, overrides, keep_none=False):
    result = dict(defaults)
    for key, value in overrides.items():
        if value is None and not keep_none:
            continue
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_settings(result[key], value, keep_none)
        else:
            result[key] = value
    return result'''),
    "rename": (
        "Rename the variable `buf` to `chunks` everywhere in this function and change nothing else:",
        '''def read_frames(stream, frame_size, limit=None):
    buf = []
    total = 0
    while limit is None or total < limit:
        data = stream.read(frame_size)
        if not data:
            break
        buf.append(data)
        total += len(data)
    if limit is not None and total > limit:
        buf[-1] = buf[-1][:len(buf[-1]) - (total - limit)]
    return b"".join(buf)'''),
    "logging": (
        "Replace the print calls with calls to a module-level `logger` (logging.getLogger(__name__)):",
        '''def sync_directory(src, dst, dry_run=False):
    copied = 0
    for name in sorted(os.listdir(src)):
        source = os.path.join(src, name)
        target = os.path.join(dst, name)
        if os.path.isdir(source):
            print(f"skipping directory {source}")
            continue
        if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(source):
            print(f"up to date: {target}")
            continue
        print(f"copying {source} -> {target}")
        if not dry_run:
            shutil.copy2(source, target)
        copied += 1
    return copied'''),
}
SYSTEMS = {"plain": ["--draft", "none"], "default": []}


def parse_stats(text: str) -> dict:
    out = {}
    m = re.search(r"(\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\)", text)
    if m:
        out.update(n_generated=int(m.group(1)), generate_s=float(m.group(2)), tokens_per_second=float(m.group(3)))
    m = re.search(r"drafted (\d+), accepted (\d+)", text)
    out.update(n_drafted=int(m.group(1)) if m else 0, n_accepted=int(m.group(2)) if m else 0)
    m = re.search(r"; (\d+) steps,", text)
    if m:
        out["n_steps"] = int(m.group(1))
    m = re.search(r"steps by draft length: ([^\r\n]*)", text)
    if m:
        out["k_histogram"] = {int(k): int(c) for k, c in re.findall(r"(\d+):(\d+)", m.group(1))}
    m = re.search(r"about ([\d.]+)x plain decoding", text)
    out["speedup"] = float(m.group(1)) if m else 0.0
    return out


def one_reply(args, system: str, message: tuple) -> dict:
    import pexpect

    cmd = ["-m", "specllm.cli", "chat", "--model", args.target, "--threads", str(args.threads),
           "--max-tokens", str(args.max_tokens), *SYSTEMS[system]]
    if system != "plain":
        cmd += ["--draft", args.draft]
    child = pexpect.spawn(sys.executable, cmd, encoding="utf-8", timeout=TIMEOUT, dimensions=(50, 200))
    try:
        child.expect(PROMPT)
        intro, code = message
        child.sendline(intro + " ```python")
        for line in code.split("\n") + ["```"]:
            child.expect(r"\.\.\. ")
            child.sendline(line)
        child.expect("```\r\n")  # the echo of the closing fence
        child.expect(r"\r\n[^\r\n]*tok/s[^\r\n]*\r\n")  # the reply, then the status line
        reply = child.before
        child.expect(PROMPT)
        child.sendline("/stats")
        child.expect(PROMPT)
        stats = parse_stats(child.before)
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    return {"reply_chars": len(reply), **stats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cli_chat", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--repeat", type=positive_int, default=2)
    p.add_argument("--max-tokens", type=positive_int, default=256)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--messages", default=",".join(MESSAGES))
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cli-chat")
    args = p.parse_args(argv)
    names = names_in(p, "--messages", args.messages, MESSAGES)
    checks.out_dir(args.out)
    args.target, args.draft = resolve_model(args.target), resolve_model(args.draft)
    records = []
    for i, name in enumerate(names):
        for rep in range(args.repeat):
            order = list(SYSTEMS) if (i + rep) % 2 == 0 else list(reversed(SYSTEMS))
            for system in order:
                r = {"message": name, "system": system, "rep": rep, **one_reply(args, system, MESSAGES[name])}
                records.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    rows = []
    for name in names:
        ratios, acc = [], []
        for rep in range(args.repeat):
            got = {r["system"]: r for r in records if r["message"] == name and r["rep"] == rep}
            ratios.append(got["default"]["tokens_per_second"] / got["plain"]["tokens_per_second"])
            acc.append(got["default"])
        d = acc[-1]
        rows.append({"message": name, "speedup": statistics.median(ratios), "rounds": ratios,
                     "plain_tps": statistics.median(r["tokens_per_second"] for r in records
                                                    if r["message"] == name and r["system"] == "plain"),
                     "default_tps": statistics.median(r["tokens_per_second"] for r in acc),
                     "n_generated": d.get("n_generated"), "n_drafted": d["n_drafted"], "n_accepted": d["n_accepted"],
                     "n_steps": d.get("n_steps"), "k_histogram": d.get("k_histogram")})
    meta = {"date": datetime.date.today().isoformat(), **machine_info(), "target": args.target, "draft": args.draft,
            "repeat": args.repeat, "max_tokens": args.max_tokens, "threads": args.threads,
            "command": "python -m bench.cli_chat " + " ".join(argv if argv is not None else sys.argv[1:])}
    lines = ["| message | speed-up (rounds) | plain tok/s | default tok/s | drafted / accepted | steps / tokens |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['message']} | {r['speedup']:.2f} ({', '.join(f'{x:.2f}' for x in r['rounds'])}) | "
                     f"{r['plain_tps']:.1f} | {r['default_tps']:.1f} | {r['n_drafted']} / {r['n_accepted']} | "
                     f"{r['n_steps']} / {r['n_generated']} |")
    table = "\n".join(lines)
    print(table)
    checks.made_out_dir(args.out)
    stem = f"{meta['date']}-{meta['machine']}"
    checks.write_text(args.out / f"{stem}.json", json.dumps({"meta": meta, "summary": rows, "records": records},
                                                            indent=1))
    checks.write_text(args.out / f"{stem}.md", f"# specllm-cli chat, copy-heavy edits — {meta['date']}\n\n"
                                         f"`{meta['command']}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
