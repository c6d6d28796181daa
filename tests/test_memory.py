"""The drafting memory: earlier outputs the n-gram drafter looks up across calls (bounded, per LLM, saved and
loaded, cleared by reset() and clear_memory()); output stays plain decoding's."""

import json
import os

import pytest

import specllm
from helpers import check_kv

PROMPT, OTHER = "Hello world", "Hello there world"
N = 40


def make(make_llm, tiny, draft="ngram", **kw):
    return make_llm(tiny["target"], tiny["draft"] if draft == "model" else draft, **kw)


@pytest.fixture(scope="module")
def plain(tiny, make_llm):
    llm = make_llm(tiny["target"])
    return {p: llm.generate(p, max_tokens=N).tokens for p in (PROMPT, OTHER)}


def test_a_repeated_reply_is_drafted_from_memory(tiny, make_llm, plain):
    llm = make(make_llm, tiny)
    first = llm.generate(PROMPT, max_tokens=N, draft_length=4)
    llm.generate(OTHER, max_tokens=N, draft_length=4)
    again = llm.generate(PROMPT, max_tokens=N, draft_length=4)  # the KV cache holds OTHER: only memory knows it
    assert first.tokens == again.tokens == plain[PROMPT]
    assert first.stats.n_memory_steps == 0
    assert again.stats.n_memory_steps > 0 and again.stats.n_accepted >= N // 2
    assert again.stats.n_steps < first.stats.n_steps / 2
    check_kv(llm, llm.tokenize(PROMPT), again)


def test_memory_off_drafts_nothing_from_it(tiny, make_llm, plain):
    llm = make(make_llm, tiny, memory_tokens=0)
    for p in (PROMPT, OTHER, PROMPT):
        c = llm.generate(p, max_tokens=N, draft_length=4)
        assert c.tokens == plain[p] and c.stats.n_memory_steps == 0
    assert llm.memory_size == 0


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_auto_uses_the_memory_where_it_pays(tiny, make_llm, plain, draft):
    llm = make(make_llm, tiny, draft, ngram=True) if draft == "model" else make(make_llm, tiny)
    llm._engine.set_verify_costs([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2])  # GPU-like: drafting pays
    llm._engine.set_draft_token_cost(0.5)
    for p in (PROMPT, OTHER):
        llm.generate(p, max_tokens=N)
    again = llm.generate(PROMPT, max_tokens=N)
    assert again.tokens == plain[PROMPT]
    assert again.stats.n_memory_steps > 0, again.stats


def test_what_auto_learned_can_be_put_back_to_repeat_a_run(tiny, make_llm, plain):
    # the memory's acceptance estimates carry over from one generation to the next: a copy of the policy's state,
    # put back with the memory, makes a prompt run again (bench's rounds) draft exactly as its first run did
    from specllm import _core

    llm = make(make_llm, tiny)
    llm._engine.set_verify_costs([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2])  # GPU-like: drafting pays
    for p in (PROMPT, OTHER):
        llm.generate(p, max_tokens=N)
    n = _core.AutoPolicy.n_sources
    estimates = lambda: [llm._engine.acceptance_estimate(s) for s in range(n)]  # noqa: E731
    state, memory, before = llm._engine.policy_state(), llm._engine.memory(), estimates()
    first = llm.generate(PROMPT, max_tokens=N)
    assert first.stats.n_memory_steps > 0 and estimates() != before
    llm.reset(keep_memory=True)
    llm._engine.set_memory(memory)
    llm._engine.set_policy_state(state)
    assert estimates() == before
    again = llm.generate(PROMPT, max_tokens=N)
    assert again.tokens == first.tokens == plain[PROMPT]
    assert again.stats.k_histogram == first.stats.k_histogram and again.stats.n_steps == first.stats.n_steps
    # not during a generation, and not a state taken with other costs (a fresh policy's, or before new costs)
    with llm.stream(PROMPT, max_tokens=N) as s:
        next(iter(s))
        with pytest.raises(specllm.InvalidOptionError, match="during a generation"):
            llm._engine.set_policy_state(state)
    with pytest.raises(specllm.InvalidOptionError, match="other verify costs"):
        llm._engine.set_policy_state(_core.AutoPolicy())
    llm._engine.set_verify_costs([10.0, 10.5])
    with pytest.raises(specllm.InvalidOptionError, match="other verify costs"):
        llm._engine.set_policy_state(state)


def test_a_memory_match_that_continues_two_ways_is_not_drafted(tiny, make_llm, plain):
    # the memory holds the reply's first 12 tokens twice, each time followed by other tokens: up to there its
    # matches continue one way and are drafted; after them the key continues two ways (as a JSON value after its
    # key does across earlier outputs) and is drafted from only with memory_ambiguous_drafts on
    want = plain[PROMPT]
    others = [t for t in range(60, 250) if t not in want][:8]
    memory = want[:12] + others[:4] + [-1] + want[:12] + others[4:] + [-1]
    llm = make(make_llm, tiny)
    assert llm._engine.memory_ambiguous_drafts is False  # the default
    runs = {}
    for on in (False, True):
        llm.reset()
        llm._engine.set_memory(memory)
        llm._engine.set_memory_ambiguous_drafts(on)
        runs[on] = llm.generate(PROMPT, max_tokens=N, draft_length=4)
        assert runs[on].tokens == want
    off, on = runs[False].stats, runs[True].stats
    assert off.n_memory_steps >= 1 and on.n_memory_steps == off.n_memory_steps + 1
    assert on.n_drafted - on.n_accepted > off.n_drafted - off.n_accepted  # the extra memory draft was wrong
    llm.set_draft("ngram")  # a new drafter keeps the setting with the memory
    assert llm._engine.memory_ambiguous_drafts is True


def test_memory_is_bounded_and_keeps_the_newest(tiny, make_llm):
    llm = make(make_llm, tiny, memory_tokens=64)
    for i in range(6):
        llm.generate(f"{i} Hello world", max_tokens=N, draft_length=4)
        assert 0 < llm.memory_size <= 64
    last = llm._engine.memory()
    assert last[-1] == -1 and last.count(-1) == 1  # only the newest output (41 tokens) fits beside nothing else
    with pytest.raises(specllm.InvalidOptionError, match="memory_tokens must be >= 0"):
        make(make_llm, tiny, memory_tokens=-1)


def test_reset_clears_it_and_clear_memory_keeps_the_cache(tiny, make_llm):
    llm = make(make_llm, tiny)
    llm.generate(PROMPT, max_tokens=N)
    assert llm.memory_size > 0
    llm.clear_memory()
    assert llm.memory_size == 0
    c = llm.generate(PROMPT, max_tokens=N, draft_length=4)
    assert c.stats.n_cached > 0 and c.stats.n_memory_steps == 0
    assert llm.memory_size > 0
    before = llm._engine.memory()
    llm.reset(keep_memory=True)  # the KV cache goes, the memory stays
    assert llm._engine.memory() == before
    assert llm.generate(PROMPT, max_tokens=4).stats.n_cached == 0
    with pytest.raises(TypeError, match="keep_memory must be a bool"):
        llm.reset(keep_memory="no")  # a truthy string kept the memory
    assert llm.memory_size > 0
    llm.reset()
    assert llm.memory_size == 0


def test_set_draft_keeps_the_memory(tiny, make_llm, plain):
    llm = make(make_llm, tiny, "model")
    llm.generate(PROMPT, max_tokens=N, draft_length=4)
    before = llm._engine.memory()
    llm.set_draft("ngram")
    assert llm._engine.memory() == before
    llm.generate(OTHER, max_tokens=N, draft_length=4)
    again = llm.generate(PROMPT, max_tokens=N, draft_length=4)
    assert again.tokens == plain[PROMPT] and again.stats.n_memory_steps > 0


def test_save_and_load(tiny, make_llm, plain, tmp_path):
    llm = make(make_llm, tiny)
    llm.generate(PROMPT, max_tokens=N)
    path = tmp_path / "memory.bin"
    llm.save_memory(path)
    assert [p.name for p in tmp_path.iterdir()] == ["memory.bin"]  # no temporary file left behind
    other = make(make_llm, tiny)
    other.load_memory(path)
    assert other._engine.memory() == llm._engine.memory()
    c = other.generate(PROMPT, max_tokens=N, draft_length=4)
    assert c.tokens == plain[PROMPT] and c.stats.n_memory_steps > 0
    # a smaller memory keeps the newest outputs; of one longer than all of it, its newest part, as a generation's
    # output is kept (it kept nothing, and memory_file= then wrote the empty memory over the file)
    whole = llm._engine.memory()
    assert whole.count(-1) == 1 and len(whole) > 16
    small = make(make_llm, tiny, memory_tokens=16)
    small.load_memory(path)
    assert small._engine.memory() == whole[-16:]


def test_bad_memory_files_are_typed_errors(tiny, make_llm, tmp_path):
    llm = make(make_llm, tiny)
    llm.generate(PROMPT, max_tokens=N)
    good = tmp_path / "good.bin"
    llm.save_memory(good)
    data = good.read_bytes()
    cases = {
        "not-memory.bin": (b"GGUF" + data, "is not a specllm drafting memory"),
        "truncated.bin": (data[:-6], "truncated"),
        "header.bin": (data.replace(b'"n_tokens"', b'"n_tokenz"'), "header is damaged"),
        "version.bin": (data.replace(b'"version": 1', b'"version": 9'), "version 9"),
        "ids.bin": (data[:-4] + (10**6).to_bytes(4, "little"), "outside the vocabulary"),
        "huge.bin": (data.replace(b'"n_tokens": ', b'"n_tokens": 1e999, "x": '), "header is damaged"),  # OverflowError
        "deep.bin": (specllm.memory.MAGIC + b"[" * 100000 + b"]" * 100000 + b"\n", "header is damaged"),
    }
    before = llm._engine.memory()
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(specllm.MemoryFileError, match=message):
            llm.load_memory(tmp_path / name)
        assert llm._engine.memory() == before  # a failed load changes nothing
    with pytest.raises(FileNotFoundError):
        llm.load_memory(tmp_path / "missing.bin")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a FIFO nobody writes hung the load for ever
    for place in (fifo, tmp_path):
        with pytest.raises(specllm.MemoryFileError, match="is not a regular file"):
            llm.load_memory(place)
    # a memory of another vocabulary
    other = make_llm(tiny["draft_other_vocab"], "ngram")
    with pytest.raises(specllm.MemoryFileError, match="vocabulary has"):
        other.load_memory(good)
    # an unwritable place: an OSError, and nothing half-written
    with pytest.raises(FileNotFoundError) as e:
        llm.save_memory(tmp_path / "no-such-dir" / "m.bin")
    assert e.value.filename == str(tmp_path / "no-such-dir" / "m.bin")  # not the temporary file's name
    assert not any(p.name.startswith("m.bin") for p in tmp_path.rglob("*"))
    assert issubclass(specllm.MemoryFileError, ValueError)


def test_a_memory_of_another_vocabulary_of_the_same_size_is_refused(tiny, make_llm, tmp_path):
    """Only the vocabulary's size was compared: a model whose 299 tokens are other texts behind the same ids took
    the memory and drafted from it (and wrote its own outputs into the other model's file), as Llama-2 and
    Mistral-7B-v0.1 (32000 tokens each) would."""
    from models.tiny import write_tiny_model

    alt = str(write_tiny_model(str(tmp_path / "alt.gguf"), seed=3, vocab="byte-alt", n_pad=16, name="alt"))
    llm = make(make_llm, tiny, memory_file=tmp_path / "m.bin")
    llm.generate(PROMPT, max_tokens=N)
    llm.save_memory(tmp_path / "saved.bin")
    other = make_llm(alt, "ngram")
    assert other._engine.target.n_vocab == llm._engine.target.n_vocab
    assert other._engine.target.vocab_hash != llm._engine.target.vocab_hash
    for path in (tmp_path / "saved.bin", tmp_path / "m.bin"):
        with pytest.raises(specllm.MemoryFileError, match="other tokens than this one's"):
            other.load_memory(path)
    with pytest.raises(specllm.MemoryFileError, match="other tokens than this one's"):
        make_llm(alt, "ngram", memory_file=tmp_path / "m.bin")
    assert saved(tmp_path / "m.bin", llm) == llm._engine.memory()  # not overwritten
    make_llm(tiny["target"], "ngram").load_memory(tmp_path / "saved.bin")  # its own model family still takes it
    # a file written before the digest was kept (no "vocab" in its header) is read as before
    data = (tmp_path / "saved.bin").read_bytes()
    head, _, body = data[len(specllm.memory.MAGIC):].partition(b"\n")
    header = json.loads(head)
    del header["vocab"]
    (tmp_path / "old.bin").write_bytes(specllm.memory.MAGIC + json.dumps(header).encode() + b"\n" + body)
    other.load_memory(tmp_path / "old.bin")


def test_an_empty_memory_file_in_a_place_that_cannot_be_written_loads(tiny, make_llm, tmp_path, monkeypatch):
    """An existing empty memory (what reset() and /forget leave) was taken for no file and written again at load:
    on a read-only disk the load failed, where the same file with outputs in it loaded."""
    llm = make(make_llm, tiny, memory_file=tmp_path / "m.bin")
    llm.clear_memory()
    assert specllm.memory.load(str(tmp_path / "m.bin"), None) == []

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(specllm.files, "write_atomic", read_only)
    again = make(make_llm, tiny, memory_file=tmp_path / "m.bin")  # was MemoryFileError "cannot be written"
    assert again.memory_size == 0
    with pytest.raises(specllm.MemoryFileError, match="cannot be written"):  # no file yet: still said at load
        make(make_llm, tiny, memory_file=tmp_path / "new.bin")


def test_saves_from_two_threads_at_once_leave_one_whole_file(tmp_path):
    """The temporary file was named by the process alone: two threads saving to one path wrote into the same
    temporary file and left a truncated memory (or raised FileNotFoundError)."""
    import threading

    path, errors = str(tmp_path / "m.bin"), []
    lists = {n: [n] * (200_000 * n) for n in (5, 7)}

    def save(n):
        try:
            for _ in range(6):
                specllm.memory.save(path, lists[n], 299, "x")
        except Exception as e:  # noqa: BLE001 - what the test is about
            errors.append(e)

    threads = [threading.Thread(target=save, args=(n,)) for n in lists]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and specllm.memory.load(path, 299) in lists.values()
    assert [p.name for p in tmp_path.iterdir()] == ["m.bin"]


# --- memory_file: the memory kept in a file across processes

def saved(path, llm):
    return specllm.memory.load(str(path), llm._engine.target.n_vocab)


def test_a_memory_file_keeps_the_memory_from_one_llm_to_the_next(tiny, make_llm, plain, tmp_path):
    path = tmp_path / "memory.bin"
    llm = make(make_llm, tiny, memory_file=path)
    assert saved(path, llm) == []  # created at load: a place that cannot be written fails there
    assert os.stat(path).st_mode & 0o777 == 0o600  # it holds generated text, as the prompt states (0644 before)
    first = llm.generate(PROMPT, max_tokens=N, draft_length=4)
    assert saved(path, llm) == llm._engine.memory() != []  # written after the generation
    for chunk in llm.stream(OTHER, max_tokens=8):  # streams too, and one closed early
        break
    assert saved(path, llm) == llm._engine.memory()
    llm.close()
    # the next LLM (another process would do the same) starts with it and drafts the repeated reply from it
    again = make(make_llm, tiny, memory_file=path)
    assert again._engine.memory() == saved(path, again) != []
    c = again.generate(PROMPT, max_tokens=N, draft_length=4)
    assert c.tokens == first.tokens == plain[PROMPT] and c.stats.n_memory_steps > 0
    assert saved(path, again) == again._engine.memory()
    again.reset(keep_memory=True)
    assert saved(path, again) == again._engine.memory() != []
    again.clear_memory()  # clear_memory, reset() and load_memory are written too
    assert saved(path, again) == []
    good = tmp_path / "good.bin"
    llm2 = make(make_llm, tiny)
    llm2.generate(OTHER, max_tokens=N)
    llm2.save_memory(good)
    again.load_memory(good)
    assert saved(path, again) == saved(good, again) != []
    again.reset()
    assert saved(path, again) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.bin", "memory.bin"]  # no temporary file left


def test_bad_memory_files_fail_at_load_and_are_never_overwritten(tiny, make_llm, tmp_path):
    with pytest.raises(specllm.InvalidOptionError, match="memory_tokens=0"):
        make(make_llm, tiny, memory_tokens=0, memory_file=tmp_path / "m.bin")
    with pytest.raises(specllm.MemoryFileError, match="does not exist; create it"):
        make(make_llm, tiny, memory_file=tmp_path / "no-such-dir" / "m.bin")
    with pytest.raises(specllm.MemoryFileError, match="is a directory"):
        make(make_llm, tiny, memory_file=tmp_path)
    os.mkfifo(tmp_path / "fifo")  # its read waited for a writer forever
    with pytest.raises(specllm.MemoryFileError, match="is not a regular file"):
        make(make_llm, tiny, memory_file=tmp_path / "fifo")
    os.remove(tmp_path / "fifo")
    with pytest.raises(specllm.MemoryFileError, match="is empty"):  # not "no file"
        make(make_llm, tiny, memory_file="")
    with pytest.raises(TypeError):
        make(make_llm, tiny, memory_file=3)
    with pytest.raises(specllm.MemoryFileError, match="cannot be written"):
        make(make_llm, tiny, memory_file="/proc/specllm-memory.bin")  # a directory nobody may create files in
    # a file that is not a drafting memory (the model itself, given by mistake) or fits another vocabulary
    model = tmp_path / "model.gguf"
    model.write_bytes(open(tiny["target"], "rb").read())
    other = tmp_path / "other.bin"
    llm = make_llm(tiny["draft_other_vocab"], "ngram")
    llm.generate(PROMPT, max_tokens=8)
    llm.save_memory(other)
    for path, message in ((model, "is not a specllm drafting memory"), (other, "vocabulary has")):
        before = path.read_bytes()
        with pytest.raises(specllm.MemoryFileError, match=message):
            make(make_llm, tiny, memory_file=path)
        assert path.read_bytes() == before


def test_a_path_that_ends_like_a_directory_or_runs_through_a_file_is_refused_and_the_file_kept(tiny, make_llm,
                                                                                              tmp_path):
    """"notes.txt/" (or "notes.txt/.", "notes.txt/x"): the system says ENOTDIR, which exists() and isfile() read as
    "no file yet", and the empty memory written then replaced notes.txt (realpath drops the "/")."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"my precious notes\n")
    llm = make(make_llm, tiny)
    llm.generate(PROMPT, max_tokens=8)
    for given in (f"{notes}/", f"{notes}/.", f"{notes}/x", f"{notes}/.."):
        with pytest.raises(specllm.MemoryFileError, match="directory|is not a file"):
            make(make_llm, tiny, memory_file=given)
        with pytest.raises(OSError):
            llm.save_memory(given)
        assert notes.read_bytes() == b"my precious notes\n", given
    with pytest.raises(OSError, match="ends like a directory"):
        llm.save_memory(f"{tmp_path}/missing/")  # wrote a file named "missing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


LARGE_FILES = """
import os, resource, sys
import numpy as np
import specllm
from specllm import memory
if "asan" not in os.environ.get("LD_PRELOAD", ""):  # .ci/sanitize: ASan reserves terabytes of address space
    resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))  # 2 GiB of address space: the file is 4 GiB
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
model, d = sys.argv[1], sys.argv[2]
big = os.path.join(d, "model.gguf")  # a model given by mistake: refused after its first bytes
with open(big, "wb") as f:
    f.write(b"GGUF")
    f.truncate(4 << 30)
for call in (lambda: memory.load(big, None), lambda: specllm.LLM(model, "ngram", n_threads=1, n_ctx=512,
                                                                  profile_costs=False, memory_file=big)):
    try:
        call()
    except specllm.MemoryFileError as e:
        assert "is not a specllm drafting memory" in str(e), e
n = 1 << 30  # a memory of a billion tokens (saved with a larger bound): only the newest ones read
saved = os.path.join(d, "memory.bin")
memory.save(saved, [5, 6, -1, 7], 299, "m")
with open(saved, "r+b") as f:
    data = f.read()
    head = data[:data.index(b"\\n", len(memory.MAGIC)) + 1].replace(b'"n_tokens": 4', b'"n_tokens": %d' % n)
    f.seek(0)
    f.write(head)
    f.truncate(len(head) + 4 * n)
    f.seek(len(head) + 4 * (n - 4))
    f.write(np.asarray([5, 6, -1, 7], dtype="<i4").tobytes())
assert memory.load(saved, 299, keep=2) == [6, -1, 7]
llm = specllm.LLM(model, "ngram", n_threads=1, n_ctx=512, profile_costs=False, memory_tokens=16, memory_file=saved)
assert llm._engine.memory() == [7, -1], llm._engine.memory()  # the newest whole output
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
assert grown < 512 << 10, f"the loads took {grown >> 10} MiB more"
print("ok")
"""


def test_a_large_file_is_refused_or_read_only_in_the_part_kept(tiny, tmp_path):
    """A model given as the memory file was read whole before its first bytes were checked (1.1 GB of RSS for the
    1.5B model; MemoryError where it did not fit), and a memory saved with a larger memory_tokens was read and
    indexed whole, then cut (8 million tokens: 24 s, 1 GB). Files of 4 GiB, under a 2 GiB address space limit (not
    under ASan, which reserves terabytes: there the peak RSS tells)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", LARGE_FILES, str(tiny["target"]), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_a_memory_file_that_cannot_be_written_later_is_logged_once_not_raised(tiny, make_llm, tmp_path, caplog):
    where = tmp_path / "d"
    where.mkdir()
    llm = make(make_llm, tiny, memory_file=where / "m.bin")
    (where / "m.bin").unlink()
    where.rmdir()  # the directory went away while the LLM runs
    with caplog.at_level("WARNING", logger="specllm.memory"):
        for p in (PROMPT, OTHER):
            assert llm.generate(p, max_tokens=N).finish_reason == "length"  # the reply stands
        assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
        assert "could not be saved" in caplog.records[0].getMessage() and len(caplog.records) == 1
        where.mkdir()
        llm.generate(PROMPT, max_tokens=N)
        assert "saved to" in caplog.records[-1].getMessage() and len(caplog.records) == 2
    assert saved(where / "m.bin", llm) == llm._engine.memory()


def test_a_memory_the_draft_model_outbids_still_learns_from_its_steps(tiny, make_llm, plain):
    # the memory's estimates are kept from one request to the next, so one that learned low must be able to learn
    # again where the draft model drafts every step (a GPU): each step checks the memory's proposal for free against
    # the first token the step emitted. Here the memory holds the reply, its estimates start near 0, and the model
    # has been right so far on costs where drafting pays: the model (or a copy in the text) drafts every step, and
    # the memory's estimates climb from those steps' checks (before 2026-11-28 only plain steps checked it)
    from specllm import _core

    llm = make(make_llm, tiny, "model", ngram=True)
    llm._engine.set_verify_costs([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2])  # GPU-like: drafting pays
    llm._engine.set_draft_token_cost(0.5)
    memory = [_core.AutoPolicy.source_of(True, m, False, True) for m in (2, 3, 5, 10, 20)]
    state = llm._engine.policy_state()
    for m in (2, 3, 5, 10, 20):
        for _ in range(200):
            state.observe_shadow(m, False, False, True)
    for _ in range(50):  # the draft model: 4 of 4 drafts accepted, at the profiled cost
        state.update(4, 4, False, 2.0, 10.8, 0, 5)
    llm._engine.set_policy_state(state)
    before = [llm._engine.acceptance_estimate(s)[0] for s in memory]
    assert max(before) < 0.1
    llm._engine.set_memory(plain[PROMPT] + [-1])
    c = llm.generate(PROMPT, max_tokens=N)
    assert c.tokens == plain[PROMPT]
    # (almost) no plain step: the memory's own few drafts teach it a little (0.29 summed over its five sources
    # before 2026-11-28), the model's steps teach each source that met a match
    assert c.stats.k_histogram.get(0, 0) <= 2, c.stats
    after = [llm._engine.acceptance_estimate(s)[0] for s in memory]
    assert sum(a - b for a, b in zip(after, before)) > 1.0, (before, after, c.stats)


def test_a_memory_emptied_or_replaced_starts_its_estimates_over(tiny, make_llm, tmp_path):
    # what "auto" learned about drafting from the memory belongs to the outputs it held: reset(), clear_memory(),
    # set_memory and load_memory send the memory's estimates back to their priors, as a new process has them, so
    # that an LLM whose memory was emptied drafts as a new one does; reset(keep_memory=True) keeps them
    from specllm import _core

    memory_sources = [_core.AutoPolicy.source_of(True, m, False, True) for m in (2, 3, 5, 10, 20)]
    priors = [_core.AutoPolicy().acceptance(s) for s in memory_sources]

    def estimates(llm):
        return [llm._engine.acceptance_estimate(s) for s in memory_sources]

    def taught(llm):
        llm.reset()
        llm._engine.set_verify_costs([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2])  # GPU-like: drafting pays
        for p in (PROMPT, OTHER, PROMPT, OTHER):
            c = llm.generate(p, max_tokens=N)
        assert c.stats.n_memory_steps > 0 and estimates(llm) != priors
        return estimates(llm)

    llm = make(make_llm, tiny)
    learned = taught(llm)
    llm.reset(keep_memory=True)
    assert estimates(llm) == learned
    llm.reset()
    assert estimates(llm) == priors
    taught(llm)
    llm.clear_memory()
    assert estimates(llm) == priors and llm.memory_size == 0
    taught(llm)
    memory = llm._engine.memory()
    llm.save_memory(tmp_path / "m.bin")
    llm.load_memory(tmp_path / "m.bin")
    assert estimates(llm) == priors and llm._engine.memory() == memory
    taught(llm)
    llm._engine.set_memory(memory)
    assert estimates(llm) == priors

    # emptied, it drafts as a new LLM does: the same steps on a prompt and on the prompt again (from the memory)
    taught(llm)
    llm.clear_memory()
    fresh = make(make_llm, tiny)
    fresh._engine.set_verify_costs([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2])
    runs = [[one.generate(p, max_tokens=N).stats.k_histogram for p in (PROMPT, PROMPT)] for one in (llm, fresh)]
    assert runs[0] == runs[1]


def test_a_memory_file_in_a_directory_that_cannot_be_written_is_said_before_any_load(tmp_path):
    """`serve --memory-file` in such a place bound its port, loaded the models (a first run measured costs for a
    minute) and only then failed; the argument check now says it."""
    import subprocess
    import sys

    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o555)
    code = ("import specllm, sys\ntry:\n    specllm.memory.MemoryFile(sys.argv[1])\n    print('TAKEN')\n"
            "except specllm.MemoryFileError as e:\n    print(e)\n")
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"] \
        if os.geteuid() == 0 else []  # root writes anywhere: without the capabilities that let it
    try:
        r = subprocess.run([*prefix, sys.executable, "-c", code, str(tmp_path / "ro" / "m.bin")], capture_output=True,
                           text=True, timeout=60)
    finally:
        os.chmod(tmp_path / "ro", 0o755)
    assert r.returncode == 0 and "cannot be written: the directory" in r.stdout, (r.stdout, r.stderr)
