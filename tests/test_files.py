"""files.write_atomic, which writes the drafting memory, a saved chat and the cost profiles: whole or not at all,
and as a user's editor would (permissions and symbolic links kept)."""
import os
import stat

import pytest

from specllm import files


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_the_umasks_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_atomic(tmp_path / "a.json", b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").read_bytes() == b"{}" and mode(tmp_path / "a.json") == 0o640  # mkstemp's 0600 before
    old = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "private", b"x", new_mode=0o600)  # the drafting memory's
    finally:
        os.umask(old)
    assert mode(tmp_path / "private") == 0o600
    (tmp_path / "run").write_bytes(b"")
    os.chmod(tmp_path / "run", 0o4755)
    files.write_atomic(tmp_path / "run", b"x")
    assert mode(tmp_path / "run") == 0o755  # a set-id bit is not carried to new contents


def test_a_replaced_file_keeps_its_permissions_and_a_link_stays_a_link(tmp_path):
    target = tmp_path / "chats" / "mine.json"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o664)
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    files.write_atomic(link, b"new")
    assert link.is_symlink() and target.read_text() == "new" and mode(target) == 0o664
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["chats", "latest.json", "mine.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "m.bin"
    path.write_bytes(b"old")

    def fail(src, dst):
        raise KeyboardInterrupt  # Ctrl-C between the write and the rename

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(path, b"new")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["m.bin"]
    with pytest.raises(FileNotFoundError):
        files.write_atomic(tmp_path / "nowhere" / "m.bin", b"x")


def test_a_path_that_is_not_a_regular_file_is_refused_not_replaced(tmp_path):
    """A FIFO or a device (chat's `/save /dev/null` as root) was replaced by a regular file: the rename went over it."""
    fifo, link, folder = tmp_path / "fifo", tmp_path / "link", tmp_path / "folder"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    folder.mkdir()
    for path, words in ((fifo, "not a regular file"), (link, "not a regular file"), (folder, "is a directory")):
        with pytest.raises(OSError, match=words) as e:
            files.write_atomic(path, b"x")
        assert e.value.filename == str(path)
    assert fifo.is_fifo() and link.is_symlink() and folder.is_dir() and not any(folder.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder", "link"]


@pytest.mark.parametrize("length", [243, 255])
def test_a_name_as_long_as_the_file_system_allows_is_written(tmp_path, length):
    """The temporary file was the name + ".xxxxxxxx.tmp": a name of 243-255 bytes, which the file could have, was
    "File name too long" (a memory file, a saved chat)."""
    path = tmp_path / ("m" * length)
    files.write_atomic(path, b"new")
    files.write_atomic(path, b"newer")
    assert path.read_bytes() == b"newer" and [p.name for p in tmp_path.iterdir()] == [path.name]
