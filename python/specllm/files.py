"""Files written whole or not at all: the drafting memory, a saved chat, the cost profiles."""
from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomic(path, data: bytes) -> None:
    """Writes data to path whole or not at all: into a temporary file beside it (one of its own per call, so that two
    threads saving to one path do not share it; readable by the owner only, as tempfile makes it) renamed over it.
    An interruption (an OSError, Ctrl-C) leaves the old file as it was and no temporary file behind."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
