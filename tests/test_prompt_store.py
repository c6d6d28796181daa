"""Prompt states on disk (LLM(prompt_cache_dir=...)): a new process (here a new LLM, or a child process) whose
prompt shares a long prefix with a conversation an earlier one had reads that KV state back instead of decoding
it, and writes what an LLM that never stopped writes. The files are whole or absent, private, bounded; a
damaged file or another model's is never restored."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import specllm
from helpers import check_kv

N = 16


def long_prompt(llm, text, times=20):
    tokens = llm.tokenize(text * times)
    assert len(tokens) >= 128  # twice the least a restored state must give (PromptCache::min_tokens)
    return tokens


def states(d) -> list:
    return sorted(p.name for p in Path(d).iterdir() if p.name.endswith(".kv"))


def more(llm, prompt, reply, text=" the cat sat on a mat" * 6):
    return list(prompt) + list(reply.tokens) + llm.tokenize(text, add_special=False)


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_a_new_llm_takes_a_conversation_up_again_from_disk_and_writes_the_same(tiny, make_llm, tmp_path, draft):
    def make(**kw):
        if draft == "model":
            return make_llm(tiny["target"], tiny["near_draft"], **kw)
        return make_llm(tiny["target"], draft, **kw)

    opts = dict(max_tokens=N) if draft is None else dict(max_tokens=N, draft_length=4)
    with make(prompt_cache_dir=tmp_path) as first:
        a = long_prompt(first, "Hello world ")
        one = first.generate(a, **opts)
        assert one.stats.n_cached == 0 and not one.stats.restored_from_disk
    assert len(states(tmp_path)) == 1  # close() waited for the write
    again = make(prompt_cache_dir=tmp_path)
    a2 = more(again, a, one)
    two = again.generate(a2, **opts)
    assert two.stats.restored_from_disk, two.stats
    assert two.stats.n_restored == two.stats.n_cached >= len(a) + len(one.tokens) - 1
    kept = make()  # an LLM that never stopped: its KV cache kept a's rows
    kept.generate(a, **opts)
    assert two.tokens == kept.generate(a2, **opts).tokens
    check_kv(again, a2, two)
    # the conversation went on (by 64+ tokens): its new state replaces the one it extends
    assert again.prompt_cache_stored > 0 and len(states(tmp_path)) == 1
    three = make(prompt_cache_dir=tmp_path).generate(more(again, a2, two, " and a dog"), **opts)
    assert three.stats.restored_from_disk and three.stats.n_restored >= len(a2) + len(two.tokens) - 1


def test_a_new_question_under_the_same_long_system_prompt_reuses_it(tiny, make_llm, tmp_path):
    with make_llm(tiny["target"], "ngram", prompt_cache_dir=tmp_path) as first:
        system = long_prompt(first, "You answer questions about this file. ", times=12)
        first.generate(system + first.tokenize(" Question one?", add_special=False), max_tokens=N)
    again = make_llm(tiny["target"], "ngram", prompt_cache_dir=tmp_path)
    q2 = system + again.tokenize(" Another question entirely?", add_special=False)
    c = again.generate(q2, max_tokens=N)
    assert c.stats.restored_from_disk and len(system) - 2 <= c.stats.n_cached < len(system) + 4
    kept = make_llm(tiny["target"], "ngram")
    kept.generate(system + kept.tokenize(" Question one?", add_special=False), max_tokens=N)
    assert c.tokens == kept.generate(q2, max_tokens=N).tokens
    check_kv(again, q2, c)


def test_the_same_conversation_again_writes_nothing_new(tiny, make_llm, tmp_path):
    llm = make_llm(tiny["target"], prompt_cache_dir=tmp_path)
    a = long_prompt(llm, "Hello world ")
    llm.generate(a, max_tokens=N)
    written = llm.prompt_cache_stored
    before = {p: os.stat(tmp_path / p).st_mtime_ns for p in states(tmp_path)}
    llm.generate(a, max_tokens=N)  # the store holds all of it but the last few tokens
    assert llm.prompt_cache_stored == written
    assert {p: os.stat(tmp_path / p).st_mtime_ns for p in states(tmp_path)} == before


def test_another_model_or_exact_mode_never_reads_them_and_leaves_them(tiny, make_llm, tmp_path):
    with make_llm(tiny["target"], prompt_cache_dir=tmp_path) as first:
        a = long_prompt(first, "Hello world ")
        one = first.generate(a, max_tokens=N)
    ours = states(tmp_path)
    a2 = list(a) + list(one.tokens)
    for kw in (dict(model=tiny["draft"]), dict(model=tiny["target"], exact=True)):
        with make_llm(kw.pop("model"), prompt_cache_dir=tmp_path, **kw) as other:
            c = other.generate(a2, max_tokens=4)
            assert c.stats.n_cached == 0 and not c.stats.restored_from_disk
            other.reset()  # removes its own states, not the first model's
        assert states(tmp_path) == ours


def test_a_damaged_or_truncated_state_is_not_restored_and_is_removed(tiny, make_llm, tmp_path, caplog):
    a = None
    for damage in ("flip", "truncate", "garbage"):
        for p in states(tmp_path):
            os.remove(tmp_path / p)
        with make_llm(tiny["target"], prompt_cache_dir=tmp_path) as first:
            a = long_prompt(first, "Hello world ")
            one = first.generate(a, max_tokens=N)
        (name,) = states(tmp_path)
        path = tmp_path / name
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x40  # in the KV bytes: only the checksum tells
        elif damage == "truncate":
            data = data[:len(data) - 100]
        else:
            data = bytearray(b"not a state at all" * 10)
        path.write_bytes(bytes(data))
        caplog.clear()
        with caplog.at_level("WARNING", logger="specllm"):
            llm = make_llm(tiny["target"], prompt_cache_dir=tmp_path)
            a2 = more(llm, a, one)
            c = llm.generate(a2, max_tokens=N)
            specllm.logs.drain()
        assert not c.stats.restored_from_disk and c.stats.n_cached == 0, damage
        assert c.tokens == make_llm(tiny["target"]).generate(a2, max_tokens=N).tokens
        assert not path.exists(), damage
        assert "damaged" in caplog.text, damage
        llm.close()


def test_a_header_whose_sizes_wrap_around_is_damage_not_an_allocation(tiny, make_llm, tmp_path, caplog):
    """n_tokens 2^32 - 1 and an n_state that wrapped the sum to the file's size passed the size check: the scan
    then allocated 16 GB for the tokens (MemoryError at every load)."""
    import struct

    with make_llm(tiny["target"], prompt_cache_dir=tmp_path) as first:
        first.generate(long_prompt(first, "Hello world "), max_tokens=N)
    (name,) = states(tmp_path)
    path = tmp_path / name
    data = bytearray(path.read_bytes())
    n_tokens = 0xFFFFFFFF
    n_state = (len(data) - 40 - 4 * n_tokens) % 2**64
    data[16:20] = struct.pack("<I", n_tokens)
    data[24:32] = struct.pack("<Q", n_state)
    path.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="specllm"):
        make_llm(tiny["target"], prompt_cache_dir=tmp_path).close()
        specllm.logs.drain()
    assert not path.exists() and "damaged" in caplog.text


def test_the_identity_reads_the_weights_not_only_the_first_mib(tmp_path):
    """Two models of one size whose first MiB (a real GGUF's metadata: Qwen2.5's weights begin 5.9 MB in) is the
    same, a fine-tune that kept its base's name say, had one identity: one read the other's states (wrong text)."""
    from specllm import _core

    head = os.urandom(1 << 20)
    base, tuned, same = tmp_path / "base.gguf", tmp_path / "tuned.gguf", tmp_path / "copy.gguf"
    weights = bytearray(os.urandom(32 << 20))  # 64 samples of 64 KiB leave gaps of ~450 KiB between them
    base.write_bytes(head + bytes(weights))
    same.write_bytes(head + bytes(weights))
    weights[9 << 20:10 << 20] = os.urandom(1 << 20)  # one tensor's worth (a MiB), far past the first MiB
    tuned.write_bytes(head + bytes(weights))
    ids = [_core.prompt_store_identity(str(p), "opts") for p in (base, tuned, same)]
    assert ids[0] != ids[1] and ids[0] == ids[2]
    small = tmp_path / "small.gguf"  # shorter than the first MiB and a sample: read whole, no sample
    small.write_bytes(b"x" * 1000)
    before = _core.prompt_store_identity(str(small), "opts")
    small.write_bytes(b"y" * 1000)
    assert _core.prompt_store_identity(str(small), "opts") != before


def test_a_split_model_is_known_by_all_its_files(make_llm, tmp_path):
    """A split GGUF (x-00001-of-0000N.gguf, llama.cpp loads the rest from the first) was known by its first file
    alone: the same first file with other weights in a later one read the old weights' states (wrong text)."""
    from models.tiny import STANDARD_SET, write_tiny_model

    first = write_tiny_model(tmp_path / "m" / "split.gguf", **STANDARD_SET["target"], split_max_tensors=8)
    last = tmp_path / "m" / "split-00003-of-00003.gguf"
    assert Path(first).name == "split-00001-of-00003.gguf" and last.exists()
    other = write_tiny_model(tmp_path / "o" / "split.gguf", **dict(STANDARD_SET["target"], seed=7),
                             split_max_tensors=8)
    other_last = Path(other).with_name(last.name)
    assert other_last.stat().st_size == last.stat().st_size and other_last.read_bytes() != last.read_bytes()
    store = tmp_path / "states"
    with make_llm(first, prompt_cache_dir=store) as one:
        a = long_prompt(one, "Hello world ")
        one.generate(a, max_tokens=N)
    with make_llm(first, prompt_cache_dir=store) as same:
        assert same.generate(a + [5], max_tokens=2).stats.restored_from_disk  # the same files: read back
    last.write_bytes(other_last.read_bytes())  # other weights in the last file, the first file as it was
    with make_llm(first, prompt_cache_dir=store) as changed:
        assert not changed.generate(a + [5], max_tokens=2).stats.restored_from_disk


@pytest.mark.parametrize("draft", ["ngram", "near_draft"])
def test_chat_reset_forgets_the_conversation_not_the_states_on_disk_or_the_memory(tiny, tmp_path, draft):
    """/reset called LLM.reset(): it removed every state of the model in the directory (another process's too) and
    wrote an empty --memory-file over the one a server shared. The reply after it is a fresh conversation's."""
    from specllm.chat_session import ChatSession

    states_dir, mem = tmp_path / "states", tmp_path / "m.mem"
    session = ChatSession(tiny["target"], tiny.get(draft, draft), system="You answer. " * 30,
                          gen_options={"max_tokens": N},
                          llm_options={"n_threads": 1, "profile_costs": False, "prompt_cache_dir": states_dir,
                                       "memory_file": mem, "exact": True})
    first = session.reply("Hello world " * 10)
    assert session.llm.prompt_cache_stored > 0  # once the writes queued are done
    kept, memory = states(states_dir), mem.read_bytes()
    assert kept and len(memory) > 100
    session.reset()
    assert session.turns == [] and states(states_dir) == kept and mem.read_bytes() == memory
    again = session.reply("Hello world " * 10)  # the same first turn, from the system prompt's cached tokens
    assert again.text == first.text and again.stats.n_cached > 0
    session.llm.close()


def test_other_files_in_the_directory_are_left_alone(tiny, make_llm, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "weights.kv").write_bytes(b"not ours")
    stale = tmp_path / ("0" * 16 + "-" + "1" * 16 + ".kv.tmp.123.0")  # a writer killed an hour ago
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / ("0" * 16 + "-" + "2" * 16 + ".kv.tmp.123.1")  # another process writing now
    fresh.write_bytes(b"half")
    llm = make_llm(tiny["target"], prompt_cache_dir=tmp_path)
    llm.generate(long_prompt(llm, "Hello world "), max_tokens=N)
    llm.reset()
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "weights.kv").read_bytes() == b"not ours"
    assert not stale.exists() and fresh.exists()


def test_states_are_private_whole_and_written_at_exit_without_close(tiny, tmp_path):
    # exits without close(), and skips the interpreter's teardown (os._exit, registered first so it runs last):
    # only LLM's own exit handler waits for the write
    code = ("import atexit, os, specllm, sys\n"
            "atexit.register(os._exit, 0)\n"
            "llm = specllm.LLM(sys.argv[1], None, n_threads=1, n_ctx=512, profile_costs=False, "
            "prompt_cache_dir=sys.argv[2])\n"
            "llm.generate(llm.tokenize('Hello world ' * 40), max_tokens=4)\n")
    subprocess.run([sys.executable, "-c", code, tiny["target"], str(tmp_path)], check=True, timeout=120)
    (name,) = states(tmp_path)
    assert os.stat(tmp_path / name).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file, no probe
    llm = specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=512, profile_costs=False, prompt_cache_dir=tmp_path)
    c = llm.generate(llm.tokenize("Hello world " * 40 + "and more"), max_tokens=4)
    assert c.stats.restored_from_disk


def test_the_directory_is_bounded_least_recently_used_out_first(tiny, make_llm, tmp_path):
    llm = make_llm(tiny["target"], n_ctx=2048, prompt_cache_dir=tmp_path, prompt_cache_disk_mb=1, prompt_cache_mb=0)
    texts = ["Hello world ", "the cat sat ", "on a mat and ", "a dog ran by ", "green apples ", "rivers flow "]
    prompts = {t: long_prompt(llm, t, times=80) for t in texts}  # 400-800 tokens: 0.2-0.4 MiB of state each
    sizes = []
    for t in texts:
        llm.generate(prompts[t], max_tokens=4)
        sizes.append(llm.prompt_cache_stored)
        total = sum(os.path.getsize(tmp_path / p) for p in states(tmp_path))
        assert total <= 1 << 20
    assert len(states(tmp_path)) < len(texts)  # some went
    again = make_llm(tiny["target"], n_ctx=2048, prompt_cache_dir=tmp_path, prompt_cache_disk_mb=1,
                     prompt_cache_mb=0)
    assert again.generate(prompts[texts[-1]] + [5], max_tokens=2).stats.restored_from_disk  # the newest stayed
    assert not again.generate(prompts[texts[0]] + [5], max_tokens=2).stats.restored_from_disk  # the oldest went
    # a state larger than the whole directory is not written
    big = make_llm(tiny["target"], n_ctx=4096, prompt_cache_dir=tmp_path / "small", prompt_cache_disk_mb=1)
    big.generate(long_prompt(big, "Hello world ", times=300), max_tokens=2)
    assert big.prompt_cache_stored == 0 and states(tmp_path / "small") == []


def test_reset_removes_this_models_states(tiny, make_llm, tmp_path):
    llm = make_llm(tiny["target"], prompt_cache_dir=tmp_path)
    a = long_prompt(llm, "Hello world ")
    llm.generate(a, max_tokens=N)
    assert llm.prompt_cache_stored > 0
    llm.reset()
    assert llm.prompt_cache_stored == 0 and states(tmp_path) == []
    c = make_llm(tiny["target"], prompt_cache_dir=tmp_path).generate(a + [5], max_tokens=2)
    assert c.stats.n_cached == 0


def test_reset_removes_the_states_other_llms_wrote_after_this_one_loaded(tiny, make_llm, tmp_path):
    """reset() removed only the files this LLM knew of (found at its load, or its own): a conversation another
    process wrote later stayed on disk, and a new LLM restored it."""
    later = make_llm(tiny["target"], prompt_cache_dir=tmp_path)  # scans an empty directory
    with make_llm(tiny["target"], prompt_cache_dir=tmp_path) as writer:
        a = long_prompt(writer, "Hello world ")
        writer.generate(a, max_tokens=N)
    assert states(tmp_path)
    later.reset()
    assert states(tmp_path) == []
    assert make_llm(tiny["target"], prompt_cache_dir=tmp_path).generate(a + [5], max_tokens=2).stats.n_cached == 0


def test_a_state_written_with_a_larger_context_leaves_the_live_prefix_alone(tiny, make_llm, tmp_path):
    """An LLM with a smaller n_ctx chose the longer state on disk, llama.cpp refused it (not enough cells) after the
    live cache had been cleared for it, and the shared prefix was decoded again, at every prompt that shared it."""
    with make_llm(tiny["target"], prompt_cache_dir=tmp_path, n_ctx=2048) as big:
        p = long_prompt(big, "Hello world ", times=60)
        assert len(p) > 512
        big.generate(p, max_tokens=4)
    (kept,) = states(tmp_path)
    small = make_llm(tiny["target"], prompt_cache_dir=tmp_path, n_ctx=512, prompt_cache_mb=0)
    small.generate(p[:150], max_tokens=1)
    c = small.generate(p[:300] + [5], max_tokens=1)
    assert c.stats.n_cached == 150 and not c.stats.restored_from_disk
    assert small.generate(p[:301] + [6], max_tokens=1).stats.n_cached == 300
    assert kept in states(tmp_path)  # the other LLM's state stays


def _forge_positions(path, mode):
    """Rewrites the cell positions of a state file (llama.cpp's sequence state: a cell count at byte 12, then 12
    bytes per cell, its position first) and its checksum (prompt_file.cpp's mix), as a hand-made file would."""
    import struct
    prime, basis, mask = 0x100000001b3, 0xcbf29ce484222325, (1 << 64) - 1

    def mix(data, h):
        i = 0
        while i + 8 <= len(data):
            h = ((h ^ int.from_bytes(data[i:i + 8], "little")) * prime) & mask
            h ^= h >> 29
            i += 8
        for b in data[i:]:
            h = ((h ^ b) * prime) & mask
        return h

    b = Path(path).read_bytes()
    ident, n, _, n_state, _ = struct.unpack("<QIIQQ", b[8:40])
    toks, state = b[40:40 + 4 * n], bytearray(b[40 + 4 * n:])
    assert len(state) == n_state
    cells = struct.unpack("<I", state[12:16])[0]
    assert cells == n
    for i in range(cells):
        pos = 0 if mode == "zero" else (-5 if i == cells - 1 else i)
        state[16 + 12 * i:20 + 12 * i] = struct.pack("<i", pos)
    Path(path).write_bytes(b[:8] + struct.pack("<QIIQQ", ident, n, 0, n_state, mix(state, mix(toks, basis))) + toks +
                           state)


@pytest.mark.parametrize("mode", ["zero", "negative"])
def test_a_state_whose_positions_are_not_its_tokens_is_not_restored(tiny, make_llm, tmp_path, mode):
    """A state file with a right checksum whose cells sit at other positions than 0..n-1: all at 0 failed every
    later decode ("inconsistent sequence positions"), one at -5 stayed in the cache after a refused restore and the
    reply was read after it."""
    with make_llm(tiny["target"], prompt_cache_dir=tmp_path) as first:
        p = long_prompt(first, "Hello world ")
        first.generate(p, max_tokens=4)
    (name,) = states(tmp_path)
    _forge_positions(tmp_path / name, mode)
    q = p + [5, 6, 7]
    c = make_llm(tiny["target"], prompt_cache_dir=tmp_path).generate(q, max_tokens=8)
    assert not c.stats.restored_from_disk
    assert c.tokens == make_llm(tiny["target"]).generate(q, max_tokens=8).tokens


def test_a_write_that_fails_later_is_logged_once_and_the_replies_stand(tiny, make_llm, tmp_path, caplog):
    d = tmp_path / "states"
    llm = make_llm(tiny["target"], prompt_cache_dir=d)
    ref = make_llm(tiny["target"])
    d.rmdir()  # gone after load
    with caplog.at_level("WARNING", logger="specllm"):
        for text in ("Hello world ", "the cat sat "):
            p = long_prompt(llm, text, times=30)
            assert llm.generate(p, max_tokens=N).tokens == ref.generate(p, max_tokens=N).tokens
            llm._engine.flush_prompt_store()
        specllm.logs.drain()
    assert caplog.text.count("could not be written") == 1, caplog.text
    assert llm.prompt_cache_stored == 0


def test_a_recurrent_model_stores_nothing(tiny, make_llm, tmp_path):
    llm = make_llm(tiny["recurrent"], prompt_cache_dir=tmp_path)
    llm.generate(long_prompt(llm, "Hello world ")[:80], max_tokens=8)
    assert llm.prompt_cache_stored == 0 and states(tmp_path) == []


@pytest.mark.parametrize("where, error, match", [
    ("", specllm.InvalidOptionError, "is empty"),
    ("a-file", specllm.InvalidOptionError, "not a directory"),
    ("a-file/below", specllm.InvalidOptionError, "not a directory"),
    ("/proc/specllm-states", specllm.InvalidOptionError, "not a directory|cannot be written"),
    (5, TypeError, "prompt_cache_dir"),
])
def test_bad_directories_fail_at_load(tiny, tmp_path, where, error, match):
    (tmp_path / "a-file").write_text("x")
    if isinstance(where, str) and where and not where.startswith("/"):
        where = str(tmp_path / where)
    with pytest.raises(error, match=match):
        specllm.LLM(tiny["target"], None, profile_costs=False, prompt_cache_dir=where)
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.parametrize("value, error", [(0, specllm.InvalidOptionError), (-5, specllm.InvalidOptionError),
                                          ("64", TypeError), (2.5, TypeError)])
def test_bad_disk_sizes(tiny, tmp_path, value, error):
    with pytest.raises(error, match="prompt_cache_disk_mb"):
        specllm.LLM(tiny["target"], None, profile_costs=False, prompt_cache_dir=tmp_path, prompt_cache_disk_mb=value)


FORKED = """
import os, sys, specllm
llm = specllm.LLM(sys.argv[1], None, n_ctx=512, profile_costs=False, prompt_cache_dir=sys.argv[2])  # all cores
prompt = llm.tokenize('Hello world ' * 40)
first = llm.generate(prompt, max_tokens=4)
llm.generate(prompt + [5], max_tokens=2)  # a write queued on the parent's writer thread
pid = os.fork()
if pid == 0:  # the child: no writer thread, no llama.cpp threads (a generation here hung for ever)
    try:
        llm.generate(prompt + [7], max_tokens=4)
        sys.exit(3)
    except specllm.SpecLLMError as e:
        assert "loaded in another process" in str(e) and "'spawn'" in str(e), e
    assert llm.tokenize('Hello') and llm.prompt_cache_stored == 0  # what needs no llama.cpp thread still works
    if sys.argv[3] == 'close':
        llm.close()
    if "detect_leaks=1" in os.environ.get("ASAN_OPTIONS", ""):  # .ci/sanitize: LeakSanitizer's check at a forked
        import atexit, gc                                      # child's exit waits for ever on a lock of its
        atexit._run_exitfuncs()                                # allocator another thread held at the fork: the
        del llm                                                # exit hooks and the engine's destructor run here,
        gc.collect()                                           # then the process ends without that check
        os._exit(0)
    sys.exit(0)  # the interpreter's exit: the exit hook flushes, the engine's destructor runs
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert llm.generate(prompt + [9], max_tokens=2).stats.restored_from_disk is False  # the parent goes on
print(llm.prompt_cache_stored > 0)
"""


@pytest.mark.parametrize("end", ["exit", "close"])
def test_a_forked_child_is_told_to_load_its_own_llm_and_exits_cleanly(tiny, tmp_path, end):
    """os.fork() (multiprocessing's default on Linux) after an LLM with prompt_cache_dir: the child aborted at exit
    (std::thread's join of the parent's writer thread threw), or hung flushing a queue no thread served; and a
    generation in the child hung with more than one thread (llama.cpp's threads are not in a forked process)."""
    r = subprocess.run([sys.executable, "-c", FORKED, tiny["target"], str(tmp_path), end], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]
    assert "terminate called" not in r.stderr
