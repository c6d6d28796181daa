"""Malformed GGUF files (issue 14): 400+ damaged variants of a tiny model, each loaded in a process of its own as the
target and as the draft beside a valid target, must end in a working model or a typed specllm error: no signal
(SIGSEGV, SIGABRT), no hang, no untyped exception. The generator and the outcome table live in gguf_fuzz.py.

Each load runs in a child forked from a server process that imported specllm once (gguf_fuzz.ForkServer): ~30 s
for the whole set on 2 cores instead of ~3-5 min with a fresh interpreter per load (mode="spawn", which gives the
same outcomes file by file)."""

import collections
import time

import pytest

pytest.importorskip("gguf")  # models/tiny.py writes the base models with it

import gguf_fuzz  # noqa: E402


@pytest.mark.slow
def test_malformed_gguf_files_load_or_fail_typed(tmp_path):
    t0 = time.monotonic()
    manifest, target = gguf_fuzz.write_set(tmp_path)
    results = gguf_fuzz.run_set(manifest, target, workers=2, timeout=60.0)  # 2 workers: the machine has 2 cores
    table = gguf_fuzz.report(manifest, results, time.monotonic() - t0)
    print("\n" + table)  # the outcome table, in the test log (pytest -s, or the captured output of a failure)

    assert len(manifest) >= 300
    assert len(results) == 2 * len(manifest)
    outcomes = collections.Counter(r.outcome for r in results)
    assert outcomes["signal"] == 0, table
    assert outcomes["hang"] == 0, table
    assert outcomes["untyped error"] == 0, table
    assert not gguf_fuzz.failures(results), table

    # the fuzzing reaches past the parser: controls load, models with NaN weights fail typed at decode time,
    # and drafts with another vocabulary are refused as drafts (while loading fine as targets)
    by = {(r.file, r.role): r for r in results}
    controls = [m for m in manifest if m["expect_ok"]]
    assert len(controls) >= 5
    assert all(by[(m["file"], role)].outcome == "ok" for m in controls for role in gguf_fuzz.ROLES)
    nan = [r for r in results if r.category == "nan-weights"]
    assert any(r.detail.startswith("DecodeError") for r in nan), table
    mismatched = [m for m in manifest if m["category"] == "draft-vocab" and not m["expect_ok"]
                  and "tokenizer-pre" not in m["file"]]
    assert len(mismatched) >= 7
    for m in mismatched:
        assert by[(m["file"], "target")].outcome == "ok", by[(m["file"], "target")]
        assert by[(m["file"], "draft")].detail.startswith("IncompatibleDraftError"), by[(m["file"], "draft")]
    assert len({m["category"] for m in manifest}) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_the_harness_sees_signals_and_hangs(tmp_path, mode):
    """Without specllm's pre-check, llama.cpp aborts (SIGABRT) or segfaults on files of the set: the harness must
    report those as signals, and a load past its timeout as a hang, in both modes."""
    manifest, target = gguf_fuzz.write_set(tmp_path)
    pick = {m["what"]: m for m in manifest}
    crashing = [pick["llama.block_count = 0"], pick["output.weight as F64"], pick["every score is NaN"]]
    results = gguf_fuzz.run_set(crashing, target, workers=2, timeout=60.0, mode=mode, check=False,
                                roles=["target"])
    assert [r.outcome for r in results[:2]] == ["signal", "signal"], results
    assert results[0].detail == "SIGABRT" and "n_layer_all > 0" in results[0].stderr_tail, results[0]
    assert results[1].detail == "SIGSEGV", results[1]
    assert results[2].outcome in gguf_fuzz.PASS, results[2]
    hung = gguf_fuzz.run_set([pick["the base model as written by models/tiny.py"]], target, timeout=0.01, mode=mode,
                             roles=["draft"])
    assert hung[0].outcome == "hang", hung
    checked = gguf_fuzz.run_set(crashing[:2], target, timeout=60.0, mode=mode, roles=["draft"])
    assert [r.detail.split(":")[0] for r in checked] == ["ModelLoadError"] * 2, checked
