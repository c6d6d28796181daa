"""A real `specllm-cli serve` in a subprocess on a free 127.0.0.1 port, for the server tests. Every wait is bounded."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx

START_TIMEOUT_S = 120  # loading + the one-time cost profile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args, env=None, log_path=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "specllm.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--no-access-log", *args]
        self._log = open(log_path, "w+b") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))

    def wait_healthy(self, timeout=START_TIMEOUT_S) -> "Server":
        deadline = time.monotonic() + timeout
        saw_503 = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.log()}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    self.saw_loading = saw_503
                    return self
                saw_503 = saw_503 or r.status_code == 503
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"the server did not become healthy in {timeout} s: {self.log()}")

    def log(self) -> str:
        if not self.log_path:
            return "(no log)"
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]

    def stop(self, sig=signal.SIGINT, timeout=30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise
        return self.proc.returncode

    def metric(self, name: str, headers=None, **labels) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)"
        m = re.search(r"^" + pattern + r"$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def wait_metric(self, name, at_least, timeout=20, headers=None, **labels) -> float:
        deadline = time.monotonic() + timeout
        while True:
            v = self.metric(name, headers=headers, **labels)
            if v >= at_least or time.monotonic() > deadline:
                return v
            time.sleep(0.05)


def post_json(url: str, path: str, **body):
    """(status, JSON answer) of a POST; json.dumps escapes a lone surrogate, as a client in another language may
    send it."""
    r = httpx.post(f"{url}{path}", content=json.dumps(body), headers={"Content-Type": "application/json"},
                   timeout=60)
    return r.status_code, r.json()


def data_events(url: str, path: str, **body) -> list:
    """The JSON of each `data:` event of a streamed POST (llama-server's native endpoints)."""
    events = []
    with httpx.stream("POST", f"{url}{path}", json=dict(body, stream=True), timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events
