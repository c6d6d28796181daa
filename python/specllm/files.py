"""Files written whole or not at all: the drafting memory, a saved chat, the cost profiles."""
from __future__ import annotations

import contextlib
import os
import secrets
import stat


def write_atomic(path, data: bytes, new_mode: int = 0o666) -> None:
    """Writes data to path whole or not at all: into a temporary file beside it (one of its own per call, so that two
    threads saving to one path do not share it), flushed to the disk (a power cut leaves the old file or the new
    one, not an empty one), renamed over it. An interruption (an OSError, Ctrl-C) leaves the old file as it was and
    no temporary file behind. A symbolic link is followed (the file it names is replaced, the link stays); a replaced
    file keeps its permissions (not its set-id bits), a new one gets new_mode under the umask."""
    path = os.path.realpath(os.fspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode) & 0o777
    except OSError:
        mode = None
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), new_mode)  # and the umask
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
