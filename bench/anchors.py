"""llama.cpp anchor tools: build them from the pinned llama-cpp-python sdist, run them, parse their output.

Nothing of llama.cpp lives in the repo: the sdist is downloaded with pip into a cache folder
(~/.cache/specllm/llama.cpp-<version>/) and only the two tools the benchmark needs are built there.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TOOLS = ("llama-completion", "llama-speculative-simple")


def cache_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return Path(os.path.expanduser(f"~/.cache/specllm/llama.cpp-{version}"))


def tool_paths(version: str = LLAMA_CPP_PYTHON_VERSION) -> dict[str, Path]:
    bin_dir = cache_dir(version) / "build" / "bin"
    return {name: bin_dir / name for name in TOOLS}


def _run(cmd: list[str], log) -> None:
    print("+", " ".join(str(c) for c in cmd), file=log, flush=True)
    subprocess.run([str(c) for c in cmd], check=True, stdout=log, stderr=subprocess.STDOUT)


def build_anchors(version: str = LLAMA_CPP_PYTHON_VERSION, jobs: int = 2, log=None) -> dict[str, Path]:
    """Download the sdist, configure and build the anchor tools; a no-op when the binaries exist."""
    paths = tool_paths(version)
    if all(p.exists() for p in paths.values()):
        return paths
    root = cache_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    log = log or open(root / "build.log", "a")
    src = root / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        sdist_dir = root / "sdist"
        tarballs = glob.glob(str(sdist_dir / f"llama_cpp_python-{version}.tar.gz"))
        if not tarballs:
            # no --no-binary :all: here: it would try to build the build dependencies from source; and no
            # --no-build-isolation: pip prepares the sdist's metadata with its build backend, which a fresh machine
            # has only in an isolated environment (llama-cpp-python's wheels are not on PyPI: pip takes the sdist)
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                  f"llama-cpp-python=={version}", "-d", sdist_dir], log)  # the sdist, whatever index has wheels
            tarballs = glob.glob(str(sdist_dir / f"llama_cpp_python-{version}.tar.gz"))
        if not tarballs:
            raise RuntimeError(f"pip did not fetch the llama-cpp-python {version} sdist into {sdist_dir}")
        with tarfile.open(tarballs[0]) as tar:
            try:
                tar.extractall(root / "src", filter="data")
            except TypeError:  # Python without extraction filters (before 3.9.17 / 3.10.12 / 3.11.4)
                tar.extractall(root / "src")
    build = root / "build"
    _run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
          "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
          "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"], log)
    _run(["cmake", "--build", build, "--target", *TOOLS, f"-j{jobs}"], log)
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise RuntimeError(f"anchor build finished without {missing}; see {root / 'build.log'}")
    return paths


def prompt_file_text(prompt_text: str) -> str:
    """What to write to the -f file: `-f` drops one trailing newline (common/arg.cpp), and chat prompts end in one."""
    return prompt_text + "\n"


def _common_args(model: str, prompt_file: str, n_ctx: int, n_threads: int, temperature: float) -> list[str]:
    return ["-m", model, "-f", prompt_file, "-c", str(n_ctx), "-t", str(n_threads), "-tb", str(n_threads),
            "--temp", str(temperature), "--top-k", "0", "--top-p", "1", "--min-p", "0",  # plain temperature sampling
            "--seed", "0", "--color", "off", "--no-escape"]


def completion_cmd(binary, *, model: str, prompt_file: str, n_predict: int, n_ctx: int = 4096, n_threads: int = 2,
                   temperature: float = 0.0) -> list[str]:
    """llama-completion, plain decoding of an already chat-templated prompt (-no-cnv: no template, no chat loop)."""
    return [str(binary), *_common_args(model, prompt_file, n_ctx, n_threads, temperature),
            "-n", str(n_predict), "-no-cnv", "--no-display-prompt"]


def speculative_cmd(binary, *, model: str, prompt_file: str, max_tokens: int, spec_type: str, draft: str | None = None,
                    n_draft: int = 3, n_ctx: int = 4096, n_threads: int = 2, temperature: float = 0.0) -> list[str]:
    """llama-speculative-simple with --spec-type draft-simple (fixed n_draft, no p_min cut), or ngram-simple
    (llama.cpp's defaults: 12-token lookup, up to 48 drafted), ngram-cache or ngram-mod (their defaults). It prints
    -n + 1 tokens, hence -n max_tokens - 1."""
    cmd = [str(binary), *_common_args(model, prompt_file, n_ctx, n_threads, temperature),
           "-n", str(max_tokens - 1), "--spec-type", spec_type]
    if spec_type == "draft-simple":
        cmd += ["-md", draft, "--spec-draft-n-max", str(n_draft), "--spec-draft-n-min", "0",
                "--spec-draft-p-min", "0", "-td", str(n_threads), "-tbd", str(n_threads)]
    return cmd


def run_tool(cmd: list[str], timeout: float = 1800) -> tuple[str, str]:
    """Run a tool non-interactively; return (stdout, stderr); raise with the stderr tail when it fails."""
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}:\n{tail}")
    return stdout, stderr


def _pause(seconds: float) -> None:
    """run_parsed's wait between attempts (a test replaces it; patching time.sleep would also catch subprocess's
    own polling waits)."""
    time.sleep(seconds)


def run_parsed(cmd: list[str], parse, *args, attempts: int = 6, pause: float = 0.5, **kwargs) -> dict:
    """run_tool, then parse(stdout, stderr, *args); a run whose output lacks a line the parser needs is repeated.
    llama.cpp logs from a background thread and leaks its logger on purpose (common/log.cpp, common_log_main), so a
    run that exits while that thread is behind loses its last lines -- the counters this parser needs. On tiny test
    models (a 20 ms run) that happened in about 1 of 10 runs, and on a loaded host three runs in a row (CI, stop 20):
    the attempts wait pause, 2 pause, 4 pause... between them so that a burst of load passes. The last attempt's
    ValueError propagates."""
    for attempt in range(attempts):
        try:
            return parse(*run_tool(cmd), *args, **kwargs)
        except ValueError:
            if attempt == attempts - 1:
                raise
            _pause(pause * 2 ** attempt)


def _find(pattern: str, text: str, what: str) -> re.Match:
    m = re.search(pattern, text)
    if not m:
        raise ValueError(f"no {what} in the tool output (pattern {pattern!r})")
    return m


def parse_completion(stdout: str, stderr: str) -> dict:
    """llama-completion: text from stdout; times from common_perf_print on stderr. Generation speed: its decodes
    after the prompt ("eval time" / runs) with its "sampling time" added, as specllm's steps are timed with their
    sampling (left out before 2026-12-08: ~3% in llama.cpp's favour); the first token comes from the prompt."""
    eos = " [end of text]\n"
    text = stdout[:-2] if stdout.endswith("\n\n") else stdout
    ended = text.endswith(eos)
    text = text[: -len(eos)] if ended else text
    load = re.search(r"load time =\s*([\d.]+) ms", stderr)  # informational: optional, as in parse_speculative
    prompt = _find(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", stderr, "prompt eval time")
    ev = _find(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", stderr, "eval time")
    sampled = _find(r"samplers time =\s*[\d.]+ ms /\s*(\d+) tokens", stderr, "samplers time")
    sampling = re.search(r"\bsampling time =\s*([\d.]+) ms", stderr)
    n_prompt = int(prompt.group(2))
    eval_ms, n_eval = float(ev.group(1)) + (float(sampling.group(1)) if sampling else 0.0), int(ev.group(2))
    # the sampler counts prompt tokens and every sampled token, the end-of-generation token included
    n_gen = int(sampled.group(1)) - n_prompt - int(ended)
    return {"text": text, "n_gen": n_gen, "gen_tps": n_eval / eval_ms * 1e3 if eval_ms > 0 else 0.0,
            "prompt_ms": float(prompt.group(1)), "n_prompt": n_prompt, "load_ms": float(load.group(1)) if load else None,
            "eos": ended}


def parse_speculative(stdout: str, stderr: str, prompt_text: str, max_tokens: int) -> dict:
    """llama-speculative-simple: it prints "\\n\\n", the prompt, the answer, "\\n\\n" twice on stdout, and its
    counters on stderr. n_predict counts the end-of-generation token; every step emits its accepted drafts plus
    one token, so steps = n_predict - n_accept."""
    text = stdout[2:] if stdout.startswith("\n\n") else stdout
    if text.startswith(prompt_text):
        text = text[len(prompt_text):]
    else:  # the detokenized prompt differs slightly from the text: cut after its tail
        tail = prompt_text[-64:]
        if tail not in text:
            raise ValueError("cannot find the prompt in llama-speculative-simple's output")
        text = text[text.index(tail) + len(tail):]
    text = text[:-4] if text.endswith("\n\n\n\n") else text
    enc = _find(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr, "encoded line")
    dec = _find(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s*([\d.]+|inf|nan) t/s", stderr, "decoded line")
    n_predict = int(_find(r"n_predict\s*=\s*(\d+)", stderr, "n_predict").group(1))
    n_drafted = int(_find(r"n_drafted\s*=\s*(\d+)", stderr, "n_drafted").group(1))
    n_accept = int(_find(r"n_accept\s*=\s*(\d+)", stderr, "n_accept").group(1))
    load = re.search(r"load time =\s*([\d.]+) ms", stderr)
    ended = n_predict < max_tokens  # it stops at -n + 1 = max_tokens tokens unless the model ended first
    dec_s = float(dec.group(2))
    return {"text": text, "n_gen": n_predict - int(ended), "gen_tps": n_predict / dec_s if dec_s > 0 else 0.0,
            "prompt_ms": float(enc.group(2)) * 1e3, "n_prompt": int(enc.group(1)),
            "n_drafted": n_drafted, "n_accepted": n_accept, "n_steps": n_predict - n_accept,
            "load_ms": float(load.group(1)) if load else None, "eos": ended}
