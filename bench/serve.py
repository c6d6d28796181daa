"""The server against in-process LLM.chat, a 5-turn conversation through the server, and a bounded soak.

    python -m bench.serve                               # all three parts, the default pair, 2 threads
    python -m bench.serve --parts overhead --limit 2 --repeat 3

overhead: for each prompt and round, the same chat request streamed through `specllm-cli serve` (official `openai`
  client) and through an in-process `LLM.chat(stream=True)` with the same configuration, in alternating order;
  both see the same sequence of prompts, so their KV caches are in the same state. Reported: time to first token,
  wall time and tokens/s of each, the HTTP layer's share of the wall time (median of the paired ratios), and
  whether the texts agree.
conversation: 5 user turns resent whole each turn, as chat clients do; prompt tokens and tokens reused per turn.
soak: N mixed requests from 4 client threads (streaming and not, ~20% leaving early, ~10% invalid), every one
  with a timeout: counts of each outcome, 5xx, hangs, and the server's RSS before and after.

Results go to bench/results/serve/<date>-<host>.json and .md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import checks, tasks
from bench.checks import positive_int

REPO = Path(__file__).resolve().parent.parent
PARTS = ("overhead", "conversation", "soak")
SOAK_TASKS = ["qa", "translation", "code_edit"]  # the soak asks the first 6 questions of each
TURNS = ["Write a Python function that parses a date in ISO format.", "Add type hints to it.",
         "Now make it accept a timezone argument.", "Write two pytest tests for it.", "Summarize what the code does."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int, log) -> subprocess.Popen:
    import httpx

    cmd = [sys.executable, "-m", "specllm.cli", "serve", "--port", str(port), "--model", args.target,
           "--draft", args.draft, "--threads", str(args.threads), "--ctx", str(args.ctx), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit("the server did not become healthy in 600 s")
    except BaseException:  # and Ctrl-C or SIGTERM while it loads: not left running
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def timed_stream(chunks):
    """(text, ttft_s, wall_s) of an iterator of text pieces, timed from now."""
    t0 = time.perf_counter()
    ttft, parts = None, []
    for piece in chunks:
        if piece and ttft is None:
            ttft = time.perf_counter() - t0
        parts.append(piece or "")
    return "".join(parts), ttft or 0.0, time.perf_counter() - t0


def overhead(args, client, llm, prompts) -> dict:
    rows = []
    for p in prompts:
        messages = [{"role": "user", "content": p.turns[0]}]
        for r in range(args.repeat):
            order = ("server", "local") if r % 2 == 0 else ("local", "server")
            got = {}
            for who in order:
                if who == "server":
                    stream = client.chat.completions.create(model=args.model_id, messages=messages, stream=True,
                                                            max_tokens=args.max_tokens, temperature=0,
                                                            stream_options={"include_usage": True})
                    usage = {}

                    def pieces(stream=stream, usage=usage):
                        for c in stream:
                            if c.usage:
                                usage["n"] = c.usage.completion_tokens
                            yield c.choices[0].delta.content if c.choices else ""
                    text, ttft, wall = timed_stream(pieces())
                    n = usage.get("n", 0)
                else:
                    last = {}

                    def pieces(last=last):
                        for c in llm.chat(messages, stream=True, max_tokens=args.max_tokens):
                            last["stats"] = c.stats or last.get("stats")
                            yield c.text
                    text, ttft, wall = timed_stream(pieces())
                    n = last["stats"].n_generated
                got[who] = {"text": text, "ttft_s": ttft, "wall_s": wall, "tokens": n}
            s, lo = got["server"], got["local"]
            rows.append({"task": p.task, "id": p.id, "round": r, "server": s, "local": lo,
                         "same_text": s["text"] == lo["text"], "wall_ratio": s["wall_s"] / lo["wall_s"],
                         "tps_server": s["tokens"] / s["wall_s"], "tps_local": lo["tokens"] / lo["wall_s"]})
            print(f"  {p.task}/{p.id} round {r}: server {s['wall_s']:.2f} s ({s['tokens']} tok, ttft "
                  f"{s['ttft_s']:.2f}), in-process {lo['wall_s']:.2f} s ({lo['tokens']} tok, ttft {lo['ttft_s']:.2f})"
                  f"{'' if rows[-1]['same_text'] else ', texts differ'}", flush=True)
    ratios = [r["wall_ratio"] for r in rows]
    return {"rows": rows, "median_wall_ratio": statistics.median(ratios),
            "median_ttft_server_s": statistics.median(r["server"]["ttft_s"] for r in rows),
            "median_ttft_local_s": statistics.median(r["local"]["ttft_s"] for r in rows),
            "median_tps_server": statistics.median(r["tps_server"] for r in rows),
            "median_tps_local": statistics.median(r["tps_local"] for r in rows),
            "same_text": sum(r["same_text"] for r in rows), "n": len(rows)}


def conversation(args, client) -> list:
    messages, out = [], []
    for i, turn in enumerate(TURNS):
        messages.append({"role": "user", "content": turn})
        r = client.chat.completions.create(model=args.model_id, messages=messages, max_tokens=args.max_tokens)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        spec = r.model_extra["speculative"]
        out.append({"turn": i + 1, "prompt_tokens": r.usage.prompt_tokens,
                    "cached_tokens": r.usage.prompt_tokens_details.cached_tokens,
                    "completion_tokens": r.usage.completion_tokens, "tokens_per_second": spec["tokens_per_second"],
                    "acceptance_rate": spec["acceptance_rate"]})
        print(f"  turn {i + 1}: {out[-1]}", flush=True)
    return out


def soak(args, url, pid, questions: list[str]) -> dict:
    import httpx

    rng = random.Random(0)
    kinds = rng.choices(["stream", "plain", "leave", "invalid"], weights=[35, 35, 20, 10], k=args.soak)
    outcomes = {"ok": 0, "left_early": 0, "4xx": 0, "5xx": 0, "hang": 0, "other": 0}
    statuses = []
    rss_before = rss_mb(pid)

    def one(i):
        kind = kinds[i]
        body = {"messages": [{"role": "user", "content": rng.choice(questions)}],
                "max_tokens": rng.randint(1, args.soak_tokens)}
        if kind == "invalid":
            body = rng.choice([{"messages": []}, {"messages": "x"}, {"messages": body["messages"], "max_tokens": -1},
                               {"messages": body["messages"], "n": 3}, {"messages": [{"role": "x", "content": 1}]}])
        try:
            with httpx.Client(base_url=url, timeout=args.soak_timeout) as c:
                if kind in ("stream", "leave"):
                    body["stream"] = True
                    with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        lines = r.iter_lines()
                        for n, line in enumerate(lines):
                            if kind == "leave" and n >= 2:
                                return "left_early", r.status_code
                        return _outcome(r.status_code), r.status_code
                r = c.post("/v1/chat/completions", json=body)
                return _outcome(r.status_code), r.status_code
        except httpx.TimeoutException:
            return "hang", None
        except httpx.HTTPError:
            return "other", None

    t0 = time.monotonic()
    pool = ThreadPoolExecutor(4)
    try:
        for outcome, status in pool.map(one, range(args.soak)):
            outcomes[outcome] += 1
            statuses.append(status)
    finally:  # Ctrl-C or SIGTERM: the requests not begun are dropped (the with block waited for all of them)
        pool.shutdown(wait=True, cancel_futures=True)
    return {"requests": args.soak, "outcomes": outcomes, "wall_s": time.monotonic() - t0,
            "rss_mb_before": rss_before, "rss_mb_after": rss_mb(pid),
            "health_after": httpx.get(f"{url}/health", timeout=10).status_code}


def _outcome(status: int) -> str:
    return "ok" if status == 200 else "4xx" if 400 <= status < 500 else "5xx" if status >= 500 else "other"


def report(res: dict) -> str:
    lines = [f"# specllm serve bench, {res['meta']['date']} on {res['meta']['host']}", "",
             f"`{res['meta']['command']}`", ""]
    if "overhead" in res:
        o = res["overhead"]
        lines += ["## Server vs in-process LLM.chat (streaming, interleaved)", "",
                  "| | in-process | server |", "|---|---:|---:|",
                  f"| median time to first token (s) | {o['median_ttft_local_s']:.3f} | {o['median_ttft_server_s']:.3f} |",
                  f"| median tokens/s (wall) | {o['median_tps_local']:.2f} | {o['median_tps_server']:.2f} |", "",
                  f"Median paired wall-time ratio server / in-process: {o['median_wall_ratio']:.3f} over {o['n']} "
                  f"pairs; identical texts in {o['same_text']} of {o['n']}.", ""]
    if "conversation" in res:
        lines += ["## A 5-turn conversation through the server", "",
                  "| turn | prompt tokens | reused from cache | completion tokens | tok/s | acceptance |",
                  "|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {t['turn']} | {t['prompt_tokens']} | {t['cached_tokens']} | {t['completion_tokens']} | "
                  f"{t['tokens_per_second']:.1f} | {t['acceptance_rate']:.2f} |" for t in res["conversation"]]
        lines.append("")
    if "soak" in res:
        s = res["soak"]
        lines += ["## Soak", "", f"{s['requests']} requests from 4 threads in {s['wall_s']:.0f} s: "
                  + ", ".join(f"{k} {v}" for k, v in s["outcomes"].items())
                  + f"; RSS {s['rss_mb_before']:.0f} MB before, {s['rss_mb_after']:.0f} MB after; /health "
                  f"{s['health_after']} after.", ""]
    return "\n".join(lines)


def read_prompts(args, parts: list) -> tuple[list, list]:
    """The overhead's prompts and the soak's questions, read before the server starts and a model loads (else
    fail()): a missing Spec-Bench file is said at once, not after minutes of loading."""
    try:
        prompts = tasks.load_tasks(args.task_names, limit=args.limit) if "overhead" in parts else []
        questions = [p.turns[0] for p in tasks.load_tasks(SOAK_TASKS, limit=6)] if "soak" in parts else []
    except tasks.PromptError as e:
        checks.fail(str(e))
    if "overhead" in parts and not prompts:
        checks.fail(f"no prompts to run: --tasks {args.tasks} leaves none (other tasks)")
    return prompts, questions


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from: %(default)s")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--tasks", default="qa,code_edit,summarization,translation",
                   help=f"the overhead's, comma-separated, from: {', '.join(tasks.ALL_TASKS)} (default: %(default)s)")
    p.add_argument("--limit", type=positive_int, default=2, help="prompts per task (overhead)")
    p.add_argument("--repeat", type=positive_int, default=3, help="rounds per prompt (overhead)")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--soak", type=int, default=300, help="soak requests")
    p.add_argument("--soak-tokens", type=int, default=12, help="most tokens per soak request")
    p.add_argument("--soak-timeout", type=float, default=120.0, help="seconds before a soak request is a hang")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serve")
    args = p.parse_args(argv)
    parts = checks.names_in(p, "--parts", args.parts, PARTS)
    args.task_names = checks.names_in(p, "--tasks", args.tasks, tasks.ALL_TASKS)
    prompts, questions = read_prompts(args, parts)
    checks.out_dir(args.out)
    from bench.run import resolve_model  # a name the registry does not know fails here, not in the server's log
    args.target = resolve_model(args.target)
    if args.draft.lower() not in ("none", "ngram"):  # as the CLI reads --draft
        args.draft = resolve_model(args.draft, "--draft")

    import openai
    import specllm
    from specllm.server.app import model_id_of

    checks.made_out_dir(args.out)
    stem = f"{datetime.date.today().isoformat()}-{socket.gethostname()}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(args.out / f"{stem}.server.log", "w") as log:
        proc = start_server(args, port, log)
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
            args.model_id = client.models.list().data[0].id
            res = {"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                            "host": socket.gethostname(), "command": "python -m bench.serve " + " ".join(argv or
                                                                                                        sys.argv[1:]),
                            "args": {k: str(v) for k, v in vars(args).items()}}}
            if "overhead" in parts:
                draft = None if args.draft.lower() == "none" else args.draft  # as the CLI reads --draft none
                llm = specllm.LLM(args.target, draft, n_threads=args.threads, n_ctx=args.ctx)
                assert model_id_of(llm) == args.model_id
                print(f"overhead: {len(prompts)} prompts x {args.repeat} rounds", flush=True)
                res["overhead"] = overhead(args, client, llm, prompts)
                del llm
            if "conversation" in parts:
                print("conversation", flush=True)
                res["conversation"] = conversation(args, client)
            if "soak" in parts:
                print(f"soak: {args.soak} requests", flush=True)
                res["soak"] = soak(args, url, proc.pid, questions)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                res_rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                res_rc = "killed"
    res["server_exit"] = res_rc
    md = report(res) + f"\nServer exit status after SIGINT: {res_rc}.\n"
    checks.write_all(args.out, stem, {"json": json.dumps(res, indent=1), "md": md})
    print(md)
    return 0


if __name__ == "__main__":
    checks.sigterm_exits()
    sys.exit(main())
