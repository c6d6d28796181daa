"""How long a big answer holds the server's event loop: the longest /health round trip while one request with
logprobs (n choices of max_tokens tokens, top_logprobs alternatives each) is generated and answered.

    python -m bench.loop_stall                      # the tiny test model: 8 x 1024 tokens x 20 (10 MB), 3 runs
    python -m bench.loop_stall --no-logprobs        # the same request without logprobs, for comparison

A server (`specllm-cli serve`, draft none, one thread) on a loopback port per run; /health polled every 10 ms from
another thread. Prints each run's worst /health time and the median.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench.checks import positive_int


def one_run(model: str, n: int, max_tokens: int, top: int, logprobs: bool) -> float:
    import httpx

    port = random.randint(20000, 40000)
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, SPECLLM_PROFILES=f"{scratch}/profiles", SPECLLM_CACHE=f"{scratch}/cache")
        server = subprocess.Popen([sys.executable, "-m", "specllm.cli", "serve", "--model", model, "--draft", "none",
                                   "--threads", "1", "--ctx", str(max(2048, 2 * max_tokens)), "--port", str(port),
                                   "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not become healthy in 300 s")
                time.sleep(0.2)
            worst, done = [0.0], threading.Event()

            def poll():
                while not done.is_set():
                    t = time.perf_counter()
                    httpx.get(f"{url}/health", timeout=120)
                    worst[0] = max(worst[0], time.perf_counter() - t)
                    time.sleep(0.01)

            poller = threading.Thread(target=poll)
            poller.start()
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "n": n,
                    "temperature": 1.0}
            if logprobs:
                body.update(logprobs=True, top_logprobs=top)
            try:
                r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
            finally:
                done.set()
                poller.join(130)
            print(f"status {r.status_code}, {len(r.content) / 1e6:.1f} MB; worst /health {worst[0]:.2f} s",
                  flush=True)
            return worst[0]
        finally:
            server.terminate()
            server.wait(30)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/specllm/test-models/target.gguf"))
    ap.add_argument("--n", type=positive_int, default=8)
    ap.add_argument("--max-tokens", type=positive_int, default=1024)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--runs", type=positive_int, default=3)
    ap.add_argument("--no-logprobs", action="store_true")
    args = ap.parse_args(argv)
    worst = [one_run(args.model, args.n, args.max_tokens, args.top, not args.no_logprobs) for _ in range(args.runs)]
    print(f"median worst /health: {statistics.median(worst):.2f} s over {args.runs} runs")


if __name__ == "__main__":
    main()
