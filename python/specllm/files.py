"""Files written whole or not at all: the drafting memory, a saved chat, the cost profiles."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def write_atomic(path, data: bytes) -> None:
    """Writes data to path whole or not at all: into a temporary file beside it (one of its own per call, so that two
    threads saving to one path do not share it) renamed over it. An interruption (an OSError, Ctrl-C) leaves the old
    file as it was and no temporary file behind. A symbolic link is followed (the file it names is replaced, the link
    stays); the file keeps its permissions, or gets the umask's as a new file."""
    path = os.path.realpath(os.fspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it: a race with other threads' files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
