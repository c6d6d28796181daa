"""Model paths that are not plain readable GGUF files, found by a review of loading: a FIFO (the load waited for
ever), a device ("empty ... interrupted download"), a file the user cannot read ("not a GGUF file ... convert it"),
a split model whose later file holds a tensor llama.cpp crashes on (only the first file was checked: a segfault),
and a registry model damaged at its right size. Each load runs in a child process, bounded, so that a hang or a
crash fails the test instead of the suite."""

import os
import shutil
import subprocess
import sys

import gguf
import pytest

from models.tiny import write_tiny_model

LOAD = ("import specllm, sys\n"
        "try:\n"
        "    llm = specllm.LLM(sys.argv[1], None if sys.argv[2] == '-' else sys.argv[2], n_threads=1, "
        "profile_costs=False, ngram=False)\n"
        "    llm.generate('hi', max_tokens=2)\n"
        "    print('LOADED')\n"
        "except specllm.SpecLLMError as e:\n"
        "    print(type(e).__name__ + ': ' + str(e))\n")


def load(model, draft="-", prefix=(), timeout=120):
    r = subprocess.run([*prefix, sys.executable, "-c", LOAD, str(model), str(draft)], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, SPECLLM_PROFILES="/nonexistent-profiles"))
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    return r.stdout.strip()


def test_a_fifo_or_a_device_is_not_a_regular_file(tiny, tmp_path):
    os.mkfifo(tmp_path / "model.gguf")
    for model, draft in ((tmp_path / "model.gguf", "-"), (tiny["target"], tmp_path / "model.gguf"),
                         ("/dev/zero", "-")):
        out = load(model, draft, timeout=60)  # the FIFO waited for a writer for ever
        assert out.startswith("ModelLoadError:") and "not a regular file" in out, out


def test_a_file_that_cannot_be_read_says_so(tiny, tmp_path):
    shutil.copy(tiny["target"], tmp_path / "model.gguf")
    os.chmod(tmp_path / "model.gguf", 0)
    os.makedirs(tmp_path / "closed")
    shutil.copy(tiny["target"], tmp_path / "closed" / "model.gguf")
    os.chmod(tmp_path / "closed", 0)
    # root reads any file: drop the capabilities that let it (as an ordinary user, no need)
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"] \
        if os.geteuid() == 0 else []
    try:
        for model in (tmp_path / "model.gguf", tmp_path / "closed" / "model.gguf"):
            out = load(model, prefix=prefix)
            assert out.startswith("ModelLoadError: cannot read the model file") and "ermission denied" in out, out
            assert "convert" not in out and "not found" not in out
    finally:
        os.chmod(tmp_path / "closed", 0o755)


def test_a_later_file_of_a_split_model_is_checked_too(tmp_path):
    first = write_tiny_model(str(tmp_path / "m.gguf"), split_max_tensors=5)
    assert os.path.basename(first) == "m-00001-of-00005.gguf" and load(first) == "LOADED"
    third = tmp_path / "m-00003-of-00005.gguf"
    t = next(t for t in gguf.GGUFReader(third).tensors if len(t.shape) == 2)
    raw = bytearray(third.read_bytes())
    pos = raw.find(t.name.encode()) + len(t.name)
    pos += 4 + 8 * int.from_bytes(raw[pos:pos + 4], "little")
    raw[pos:pos + 4] = (26).to_bytes(4, "little")  # GGML_TYPE_I32: as many bytes an element as F32
    third.write_bytes(raw)
    out = load(first)  # was a segfault at the first decode
    assert out.startswith("ModelLoadError:") and "m-00003-of-00005.gguf" in out and "I32" in out, out


def test_a_registry_model_damaged_at_its_size_is_damage_not_a_conversion(tmp_path, monkeypatch):
    from specllm import registry

    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path))
    name, entry = next((n, e) for n, e in registry.known_models().items() if registry.known_size(e))
    path = registry.cached_path(name)
    with open(path, "wb") as f:
        f.truncate(registry.known_size(entry))  # zeros at the right size, as a disk may leave it
    with pytest.raises(registry.RegistryError, match="does not start as a GGUF file does: it is damaged.*pull"):
        registry.resolve(name, pull=False)
    assert [m["damaged"] for m in registry.list_cached() if m["name"] == name] == [True]
