"""Files written whole or not at all (the drafting memory, a saved chat, the cost profiles), and a lock between
processes."""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time

try:
    import fcntl
except ImportError:  # Windows: no locks between processes here
    fcntl = None


def check_file_path(given: str) -> None:
    """OSError for a path that names a directory by its form (a trailing separator, '.' or '..' last) or runs through
    a file ("notes.txt/x"): the system says ENOTDIR there, which exists() and isfile() read as "no file yet", and
    realpath drops the "/" (a write there replaced notes.txt)."""
    if given.endswith(os.sep) or (os.altsep and given.endswith(os.altsep)) or os.path.basename(given) in (".", ".."):
        raise OSError(errno.EISDIR, "ends like a directory's path, not a file's", given)
    try:
        os.stat(given)
    except NotADirectoryError:
        raise OSError(errno.ENOTDIR, "a part of the path before its last is a file, not a directory", given) from None
    except OSError:
        pass


def write_atomic(path, data: bytes, new_mode: int = 0o666) -> None:
    """Writes data to path whole or not at all: into a temporary file beside it (one of its own per call, so that two
    threads saving to one path do not share it), flushed to the disk (a power cut leaves the old file or the new
    one, not an empty one), renamed over it. An interruption (an OSError, Ctrl-C) leaves the old file as it was and
    no temporary file behind. A symbolic link is followed (the file it names is replaced, the link stays); a replaced
    file keeps its permissions (not its set-id bits), a new one gets new_mode under the umask; a path that is not a
    regular file (a device, a FIFO, a directory) is an OSError, never replaced, and so is a path that ends like a
    directory's ("notes.txt/") or runs through a file ("notes.txt/x"). An OSError names the path given, not
    the temporary file."""
    given = os.fspath(path)
    check_file_path(given)
    path = os.path.realpath(given)
    try:
        st = os.stat(path)
    except OSError:
        mode = None
    else:
        if not stat.S_ISREG(st.st_mode):  # a device, a FIFO (/dev/null: root's write replaced it with a file)
            raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL,
                          "is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file, not replaced", given)
        mode = stat.S_IMODE(st.st_mode) & 0o777
    # named apart from the file's own name: path + a suffix made a name past the file system's limit (255 bytes)
    # for a name of 243+ that the file itself could have
    tmp = os.path.join(os.path.dirname(path), f".{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), new_mode)  # and umask
    except OSError as e:  # a missing directory, no permission, a full disk
        raise OSError(e.errno, e.strerror, given) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None:
            raise OSError(e.errno, e.strerror, given) from None
        raise


_held = set()  # the lock files' descriptors this process holds (exclusive)


def _forked() -> None:
    """A forked child shares its parent's locks (one open file description): it closes its copies, so that a child
    living on (a pool's worker) does not hold the parent's lock after the parent let it go."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


@contextlib.contextmanager
def exclusive(lock_path, wait_s: float, on_wait=lambda: None, stopped=lambda: False):
    """Holds an exclusive lock on lock_path (made if missing, 0600; the kernel frees it when the process dies) within
    it, waiting for another process's hold up to wait_s seconds (on_wait() called once when it must wait; stopped()
    polled, it may raise). Yields False when it got the lock at once, True after a wait, None when it gave up (after
    wait_s, or stopped() was true); False too where no lock can be had (no fcntl, a read-only directory, a file
    system without locks): the work goes on unlocked, as it would have."""
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(os.fspath(lock_path), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            _held.add(fd)  # from now: a child forked while this waits closes its copy, and the end closes it
        except OSError:
            fd = None
    try:
        held, deadline = False, time.monotonic() + wait_s
        while fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not held:
                    on_wait()
                    held = True
                if stopped() or time.monotonic() > deadline:
                    held = None
                    break
                time.sleep(0.05)
            except OSError:  # no locks on this file system
                break
        yield held
    finally:  # also when the wait ends by an error (stopped() raising, Ctrl-C): the descriptor is not left open
        if fd is not None and fd in _held:  # (not closed by a fork's _forked: this is the child)
            _held.discard(fd)
            os.close(fd)  # and the lock with it
