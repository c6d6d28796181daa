"""The bench tools on bad input: bad arguments, damaged files, an unusable --out, Ctrl-C, a full disk. Each says what
is wrong in one line (argparse's exit 2, or "error: ..." and exit 1), with no traceback, before loading a model, and
leaves no half-written or empty result files."""
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import (calibrate, checks, compare, multicall, oracle, run, simulate, spread, static_policy,  # noqa: E402
                   tasks)

MODELS = Path.home() / ".cache" / "specllm" / "test-models"
TARGET, DRAFT = str(MODELS / "target.gguf"), str(MODELS / "draft.gguf")
PAIR = ["--target", TARGET, "--draft", DRAFT, "--threads", "1"]
SERVE = ["bench.serve", "--target", TARGET, "--draft", "ngram", "--threads", "1", "--ctx", "512"]
MEASURING = ("bench.run", "bench.multicall", "bench.serve")  # they write into --out (the test's own folder)


def bench(tmp_path, *args, timeout=120, env=None, **kw):
    env = dict(os.environ, SPECLLM_PROFILES=str(tmp_path / "profiles"), **(env or {}))
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert "error:" in last, stderr
    return last


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Damaged inputs: prompt files, a regular file in the way of --out."""
    d = tmp_path_factory.mktemp("bad")
    (d / "garbled.jsonl").write_text("not json\n")
    (d / "nokeys.jsonl").write_text('{"question_id": 1, "category": "qa"}\n')
    (d / "empty.jsonl").write_text("")
    (d / "norequests.jsonl").write_text('{"id": "x", "kind": "tool_calls", "mode": "independent", "requests": [], '
                                        '"source": "test"}\n')
    (d / "afile").write_text("x")
    return d


# (tool and arguments, exit status): {d} is the damaged files' folder
BAD = [
    (["bench.run", *PAIR, "--tasks", "bogus"], 2),
    (["bench.run", *PAIR, "--tasks", ""], 2),
    (["bench.run", *PAIR, "--systems", "plainn"], 2),
    (["bench.run", *PAIR, "--tasks", "code_edit", "--limit", "0"], 2),
    (["bench.run", *PAIR, "--tasks", "code_edit", "--limit", "-1"], 2),
    (["bench.run", *PAIR, "--tasks", "code_edit", "--max-tokens", "-5"], 2),
    (["bench.run", *PAIR, "--tasks", "code_edit", "--skip", "1000"], 1),
    (["bench.run", "--target", "qwen2.5-coder-1.5bb", "--draft", DRAFT, "--systems", "plain", "--tasks", "code_edit"],
     1),
    (["bench.run", "--target", "/nope/x.gguf", "--draft", DRAFT, "--systems", "plain", "--tasks", "code_edit"], 1),
    (["bench.run", *PAIR, "--tasks", "qa", "--specbench", "/nope/dev.jsonl"], 1),
    (["bench.run", *PAIR, "--tasks", "qa", "--specbench", "{d}/garbled.jsonl"], 1),
    (["bench.run", *PAIR, "--tasks", "qa", "--specbench", "{d}/nokeys.jsonl"], 1),
    (["bench.run", *PAIR, "--tasks", "qa", "--specbench", "{d}"], 1),
    (["bench.run", *PAIR, "--tasks", "qa", "--specbench", "{d}/empty.jsonl"], 1),
    (["bench.run", *PAIR, "--tasks", "code_edit", "--out", "{d}/afile"], 1),
    (["bench.run", *PAIR, "--tasks", "code_edit", "--out", "{d}/afile/sub"], 1),
    (["bench.multicall", *PAIR, "--sequences", "nope"], 1),
    (["bench.multicall", *PAIR, "--prompts", "{d}/garbled.jsonl"], 1),
    (["bench.multicall", *PAIR, "--prompts", "{d}/nokeys.jsonl"], 1),
    (["bench.multicall", *PAIR, "--prompts", "{d}/empty.jsonl"], 1),
    (["bench.multicall", *PAIR, "--prompts", "{d}/norequests.jsonl"], 1),
    (["bench.multicall", *PAIR, "--limit", "0"], 2),
    (["bench.multicall", *PAIR, "--systems", ""], 2),
    (["bench.multicall", "--target", "qwen2.5-coder-1.5bb", "--draft", "ngram", "--systems", "plain", "--limit", "1"],
     1),
    (["bench.multicall", "--target", "/nope/x.gguf", "--draft", "ngram", "--systems", "plain", "--limit", "1"], 1),
    (["bench.multicall", *PAIR, "--limit", "1", "--out", "{d}/afile"], 1),
    ([*SERVE, "--parts", "bogus"], 2),
    ([*SERVE, "--tasks", "bogus"], 2),
    ([*SERVE, "--parts", "overhead", "--tasks", ""], 2),
    ([*SERVE, "--parts", "soak", "--out", "{d}/afile"], 1),
    # a name the registry does not know: said before the server starts (it was a "see the server's log" after)
    (["bench.serve", "--target", "qwen2.5-coder-1.5bb", "--draft", "ngram", "--parts", "conversation"], 1),
    (["bench.serve", "--target", TARGET, "--draft", "/nope/x.gguf", "--parts", "conversation"], 1),
    *[([f"bench.{tool}", "--model", TARGET, "--threads", "1", "--rounds", rounds], 2)
      for tool in ("fim", "logprobs", "grammar", "prompt_cache", "prompt_store", "editor") for rounds in ("0", "-1")],
    (["bench.kv_cache", *PAIR, "--tasks", "bogus"], 2),
    (["bench.spread", "record", *PAIR, "--prompts", "bogus", "--out", "{d}/spread.json"], 2),
    (["bench.prompt_cache", "--model", TARGET, "--file", "/nope/file.py"], 2),
    (["bench.draft_overhead", "--model", TARGET, "--prompts", "bogus"], 2),
    (["bench.profile_spread", "--target", TARGET, "--loads", "0"], 2),
    (["bench.profile_spread", "--target", "/nope/x.gguf"], 1),
]


@pytest.mark.parametrize("args, status", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_arguments_and_files_end_in_one_error_line_and_write_nothing(tmp_path, files, args, status):
    out = tmp_path / "out"
    args = [a.format(d=files) for a in args]
    own_out = "--out" in args  # a --out among the damaged files: the listing below is the check
    if args[0] in MEASURING and not own_out:
        args += ["--out", str(out)]
    r = bench(tmp_path, *args, timeout=60)
    assert r.returncode == status, r.stderr
    one_line_error(r.stderr)
    if own_out:
        assert (files / "afile").read_text() == "x"  # the file in the way of --out is left as it was
    else:
        assert not out.exists()
    assert sorted(p.name for p in files.iterdir()) == ["afile", "empty.jsonl", "garbled.jsonl", "nokeys.jsonl",
                                                      "norequests.jsonl"]


@pytest.mark.parametrize("parts, task", [("overhead", "qa"), ("soak", "code_edit")])
def test_bench_serve_says_a_missing_prompt_file_before_it_starts_the_server(tmp_path, parts, task):
    """bench.serve read its prompts only once its server ran and, for the overhead, an LLM was loaded: minutes on a
    real model before "not found". The server's log is made in --out just before the server starts: no --out, no
    server."""
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = bench(tmp_path, *SERVE, "--parts", parts, "--tasks", task, "--out", str(out), timeout=60,
              env={"SPECLLM_SPECBENCH": str(tmp_path / "nope" / "dev.jsonl")})
    assert r.returncode == 1, r.stderr
    assert one_line_error(r.stderr) == f"error: Spec-Bench questions not found at {tmp_path / 'nope' / 'dev.jsonl'}: " \
        "pass --specbench PATH or set SPECLLM_SPECBENCH"
    assert not out.exists() and time.monotonic() - t0 < 30


@pytest.mark.slow
@pytest.mark.parametrize("status", [130, 143])  # Ctrl-C, SIGTERM (checks.sigterm_exits: SystemExit(143))
@pytest.mark.parametrize("tool", [run, multicall], ids=["run", "multicall"])
def test_a_stop_between_two_result_files_leaves_none_and_keeps_the_records(tmp_path, capsys, monkeypatch, tool,
                                                                            status):
    """A stop after the .json was written and before the .md: bench.multicall left the .json without its .md."""
    write_bytes, written = checks.write_bytes, []

    def second_write_stops(path, data):
        if written:
            raise KeyboardInterrupt if status == 130 else SystemExit(status)
        write_bytes(path, data)
        written.append(path)

    monkeypatch.setattr(checks, "write_bytes", second_write_stops)
    out = tmp_path / "out"
    argv = [*PAIR, "--systems", "plain", "--max-tokens", "8", "--out", str(out),
            *(["--tasks", "code_edit"] if tool is run else []), "--limit", "1"]
    try:
        got = tool.main(argv)
    except SystemExit as stop:
        got = stop.code
    assert got == status and written and written[0].suffix == ".json"
    (log,) = out.glob("*.records.jsonl")
    assert sorted(p.name for p in out.iterdir()) == [log.name]  # no .json, .md, nor a temporary file
    assert log.read_text().endswith("\n")
    if status == 130:
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert said == f"interrupted; the records measured so far are in {log}"


def good_run(target: str = TARGET) -> dict:
    rec = {"task": "code_edit", "id": "ce01", "turn": 0, "rep": 0, "text": "def f():\n    return 1\n", "n_gen": 8,
           "gen_tps": 100.0, "prompt_ms": 1.0, "n_drafted": 0, "n_accepted": 0, "n_steps": 8, "load_ms": None}
    meta = {"target": target, "draft": DRAFT, "tasks": "code_edit", "limit": 1, "skip": 0, "prompts": "dev",
            "max_tokens": 8, "ctx": 4096, "systems": ["plain", "hybrid"], "chat_template": "jinja"}
    return {"meta": meta, "summary": {}, "records": [dict(rec, system=s) for s in ("plain", "hybrid")]}


def damaged(kind: str, d: Path) -> Path:
    good = good_run()
    path = d / f"{kind}.json"
    if kind == "truncated":
        path.write_text(json.dumps(good, indent=1)[:200])
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "empty":
        path.write_text("")
    elif kind == "records.jsonl":
        path = d / "run.records.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in good["records"]))
    elif kind != "missing":
        change = {"list": lambda g: [], "object": lambda g: {}, "no_records": lambda g: {"meta": g["meta"]},
                  "empty_records": lambda g: dict(g, records=[]),
                  "no_plain": lambda g: dict(g, records=g["records"][1:]),
                  "no_target": lambda g: dict(g, meta={k: v for k, v in g["meta"].items() if k != "target"}),
                  "target_gone": lambda g: good_run("/nope/gone.gguf"),
                  "no_text": lambda g: dict(g, records=[{k: v for k, v in r.items() if k != "text"}
                                                        for r in g["records"]])}[kind]
        path.write_text(json.dumps(change(good)))
    return path


REPORT_TOOLS = {
    "compare": lambda path, good: compare.main([path, good]),
    "oracle": lambda path, good: oracle.main([path]),
    "simulate": lambda path, good: simulate.main([path]),
    "calibrate": lambda path, good: calibrate.main([path]),
    "static_policy": lambda path, good: static_policy.main(["--train", good, path]),
    "static_policy --train": lambda path, good: static_policy.main(["--train", path, good]),
    "spread compare": lambda path, good: spread.main(["compare", path]),
}
DAMAGE = ["missing", "truncated", "empty", "binary", "list", "object", "no_records", "empty_records", "no_plain",
          "no_target", "target_gone", "no_text", "records.jsonl"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_report_tools_say_what_is_wrong_with_a_results_file(tmp_path, capsys, kind):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(good_run()))
    path = str(damaged(kind, tmp_path))
    for name, tool in REPORT_TOOLS.items():
        if (kind, name) in (("target_gone", "compare"), ("target_gone", "static_policy --train"),
                            ("no_target", "compare")):
            continue  # compare needs no model, and the --train runs' target is not loaded
        try:
            status = tool(path, str(good))
        except SystemExit as stop:
            status = stop.code
        err = capsys.readouterr().err
        assert status == (2 if name == "compare" else 1), (name, err)  # compare: 2 for a file it cannot read
        assert one_line_error(err).startswith("error: ") and (Path(path).name in err or "spread" in name), (name, err)
    # a bench.run file is not what spread compare reads, and says so
    with pytest.raises(SystemExit):
        spread.main(["compare", str(good)])
    assert "bench.run" in capsys.readouterr().err


def test_simulate_refuses_after_with_a_bench_run_input(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(good_run()))
    with pytest.raises(SystemExit) as stop:
        simulate.main([str(good), "--after", str(tmp_path / "missing.json")])
    assert stop.value.code == 2 and "--after" in capsys.readouterr().err


def test_a_negative_limit_is_refused_not_a_dropped_last_prompt():
    with pytest.raises(ValueError):
        tasks.load_tasks(["code_edit"], limit=-1)
    with pytest.raises(ValueError):
        multicall.load_sequences(multicall.MULTICALL_PATH, limit=-1)


@pytest.mark.slow
def test_ctrl_c_says_where_the_records_are(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "bench.run", "--target", str(MODELS / "slow.gguf"), "--draft", DRAFT,
                             "--systems", "plain,ngram", "--max-tokens", "64", "--threads", "1", "--tasks", "code_edit",
                             "--limit", "20", "--out", str(out)], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, SPECLLM_PROFILES=str(tmp_path / "profiles")))
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("[1/"):
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(60) == 130
    (log,) = out.glob("*.records.jsonl")
    assert "Traceback" not in rest and rest.strip().splitlines()[-1] == \
        f"interrupted; the records measured so far are in {log}"
    assert log.read_text().endswith("\n") and not list(out.glob("*.json"))


@pytest.mark.slow
def test_a_full_disk_at_the_end_keeps_the_records_and_writes_no_results(tmp_path):
    out = tmp_path / "out"
    t0 = time.time()
    r = bench(tmp_path, "bench.run", *PAIR, "--systems", "plain,hybrid", "--max-tokens", "16", "--tasks", "code_edit",
              "--limit", "2", "--out", str(out),
              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY)))
    assert r.returncode == 1 and time.time() - t0 < 120
    (log,) = out.glob("*.records.jsonl")
    assert one_line_error(r.stderr).endswith(f"the records measured are kept in {log}")
    assert sorted(p.name for p in out.iterdir()) == [log.name]  # no .json, .md, .png, nor a temporary file


@pytest.mark.slow
@pytest.mark.parametrize("when", ["loading", "serving"])
def test_sigterm_to_bench_serve_stops_its_server(tiny, tmp_path, when):
    """SIGTERM killed bench.serve at once and left its specllm-cli server running (and its port taken)."""
    import signal
    import time

    import httpx

    questions = tmp_path / "specbench.jsonl"  # the soak's questions (Spec-Bench is not beside a fresh clone)
    questions.write_text("".join(json.dumps({"question_id": i, "task": task, "turns": [f"Say {task} {i}."]}) + "\n"
                                 for i, task in enumerate(["qa", "translation"] * 3)))
    env = dict(os.environ, SPECLLM_PROFILES=str(tmp_path / "profiles"), SPECLLM_SPECBENCH=str(questions))
    log = open(tmp_path / "bench.log", "w")
    bench = subprocess.Popen([sys.executable, "-m", "bench.serve", "--target", tiny["target"], "--draft", "ngram",
                              "--parts", "soak", "--soak", "3000", "--threads", "1", "--ctx", "512",  # (100000: pool.map
                              # submits all first, and the signal landed inside ThreadPoolExecutor.submit)
                              "--out", str(tmp_path / "out")], cwd=REPO, env=env, stdout=log, stderr=log)
    server = None
    try:
        deadline = time.monotonic() + 60
        while server is None and time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-P", str(bench.pid), "-f", "specllm.cli serve"], capture_output=True,
                                   text=True).stdout.split()
            server = int(found[0]) if found else None
            time.sleep(0.05)
        assert server is not None, "the server never started: " + (tmp_path / "bench.log").read_text()
        if when == "serving":  # healthy, and answering the soak's requests
            port = open(f"/proc/{server}/cmdline").read().split("\0")
            port = port[port.index("--port") + 1]
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            time.sleep(1)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "bench.log").read_text()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{server}"):
            time.sleep(0.1)
        state = open(f"/proc/{server}/stat").read().split()[2] if os.path.exists(f"/proc/{server}") else "gone"
        assert state in ("gone", "Z"), f"the server {server} still runs ({state})"
    finally:
        if bench.poll() is None:
            bench.kill()
        if server is not None and os.path.exists(f"/proc/{server}"):  # not left behind when this test fails
            os.kill(server, signal.SIGKILL)
        log.close()


def test_bench_profile_spread_measures_each_load_in_a_process_of_its_own(tiny, tmp_path):
    r = bench(tmp_path, "bench.profile_spread", "--target", tiny["target"], "--threads", "1", "--loads", "2",
              "--times", "2", timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["load 1", "load 1", "load 2", "load 2"]
    assert all(" 16:" in line for line in lines[:4])
    assert lines[4].startswith("T(2)/T(1): within each load ") and lines[4].count("median") == 3
    assert lines[5].startswith("T(8)/T(1): ")
