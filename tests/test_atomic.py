"""opscope.files.atomic: all of a file or none of it, never a temp file left."""

import gzip
import os
import stat

import pytest

from opscope.files import atomic
from opscope.files.atomic import atomic_text_writer
from opscope.files.output_path import check_output_path


def test_writes_text_and_leaves_only_the_target(tmp_path):
    path = tmp_path / "out.txt"
    with atomic_text_writer(path) as f:
        f.write("line 1\n")
        f.write("ünïcode ✓ 😀\n")
    assert path.read_text(encoding="utf-8") == "line 1\nünïcode ✓ 😀\n"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_target_does_not_exist_until_the_block_ends(tmp_path):
    path = tmp_path / "out.txt"
    with atomic_text_writer(path) as f:
        f.write("x" * 5_000_000)
        f.flush()
        assert not path.exists()
        assert len(os.listdir(tmp_path)) == 1  # the temp file, beside the target
    assert path.stat().st_size == 5_000_000


def test_replaces_an_existing_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old content that is longer")
    with atomic_text_writer(str(path)) as f:
        f.write("new")
    assert path.read_text() == "new"


def test_gz_suffix_compresses_and_names_the_target_in_the_header(tmp_path):
    path = tmp_path / "trace.json.gz"
    with atomic_text_writer(path) as f:
        f.write('{"a": 1}')
    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    assert gzip.decompress(data) == b'{"a": 1}'
    # FNAME field (flag bit 3) holds the original name, not the temp file's
    assert data[3] & 0x08
    name = data[10:data.index(b"\0", 10)]
    assert name == b"trace.json"
    assert os.listdir(tmp_path) == ["trace.json.gz"]


def test_missing_folder_names_it_and_creates_nothing(tmp_path):
    folder = tmp_path / "no" / "such"
    path = folder / "trace.json"
    with pytest.raises(FileNotFoundError) as info:
        with atomic_text_writer(path) as f:
            f.write("never")
    message = str(info.value)
    assert str(folder) in message
    assert "does not exist" in message
    assert os.listdir(tmp_path) == []


def test_path_that_is_a_folder_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match="folder"):
        check_output_path(None, "path", tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["out.txt", "out.txt.gz"])
@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failure_mid_write_keeps_old_file_and_removes_temp(tmp_path, name, error):
    path = tmp_path / name
    path.write_bytes(b"previous")
    with pytest.raises(type(error)):
        with atomic_text_writer(path) as f:
            f.write("partial " * 100_000)
            raise error
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == [name]


def test_failure_in_the_final_rename_removes_temp(tmp_path, monkeypatch):
    def failing_replace(src, dst, **kwargs):
        raise PermissionError(f"cannot replace {dst}")

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(PermissionError):
        with atomic_text_writer(tmp_path / "out.txt") as f:
            f.write("data")
    assert os.listdir(tmp_path) == []


def test_new_file_mode_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_text_writer(tmp_path / "out.txt") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o644


def test_fsync_option_writes_the_same(tmp_path):
    with atomic_text_writer(tmp_path / "out.txt", fsync=True) as f:
        f.write("synced")
    assert (tmp_path / "out.txt").read_text() == "synced"
