"""Outputs compressed or encoded on a thread of their own (files/background.py) stay
whole, in order, and fail as a plain write would: one error, naming the file, no temp."""

from __future__ import annotations

import errno
import gzip
import os
import threading

import numpy as np
import pytest

from opscope.files import atomic, gzip_stream
from opscope.files.atomic import atomic_binary_writer
from opscope.files.background import Background


def _threads(prefix: str) -> list:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_items_are_consumed_in_order_and_finish_waits_for_all():
    got = []
    work = Background(lambda item: got.append(item * 2), name="opscope-test")
    for k in range(100):
        work.put(k)
    work.finish()
    work.finish()  # a second finish does nothing
    assert got == [2 * k for k in range(100)]
    assert not _threads("opscope-test")


def test_the_consumers_first_error_is_raised_in_the_callers_thread():
    seen = []

    def consume(item):
        seen.append(item)
        if item == 3:
            raise OSError(errno.ENOSPC, "No space left on device")

    work = Background(consume, name="opscope-test")
    with pytest.raises(OSError, match="No space left"):
        for k in range(1000):
            work.put(k)
        work.finish()
    with pytest.raises(OSError, match="No space left"):
        work.finish()
    assert seen[:4] == [0, 1, 2, 3] and 3 == max(seen)  # nothing consumed after the error
    assert not _threads("opscope-test")


@pytest.fixture
def small_start(monkeypatch):
    """Compress on the thread from the first kilobyte on."""
    monkeypatch.setattr(gzip_stream._BackgroundGzip, "START_BYTES", 1024)


def test_a_gz_file_written_on_the_thread_is_whole_and_names_its_target(tmp_path, small_start):
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 50, int(rng.integers(1, 300_000))).astype(np.uint8).tobytes()
              for _ in range(40)]
    path = tmp_path / "out.json.gz"
    buffer = bytearray(300_000)
    with atomic_binary_writer(path) as f:
        for chunk in chunks:  # the caller reuses one buffer, as the trace writer does
            buffer[:len(chunk)] = chunk
            f.write(memoryview(buffer)[:len(chunk)])
    assert gzip.decompress(path.read_bytes()) == b"".join(chunks)
    assert b"out.json\0" in path.read_bytes()[:40]  # the gzip header names the target
    assert os.listdir(tmp_path) == ["out.json.gz"]
    assert not _threads("opscope-gzip")


def test_a_full_disk_while_compressing_on_the_thread_names_the_file(tmp_path, small_start,
                                                                    monkeypatch):
    written = []

    def full_disk(self, data):
        written.append(len(data))
        if sum(written) > 200_000:
            raise atomic.output_error(OSError(errno.ENOSPC, "No space left on device"),
                                      self._shown)
        return memoryview(data).nbytes

    monkeypatch.setattr(atomic._RawOutput, "write", full_disk)
    path = tmp_path / "trace.json.gz"
    path.write_bytes(b"previous")
    rng = np.random.default_rng(1)
    with pytest.raises(OSError) as failed:
        with atomic_binary_writer(path) as f:
            for _ in range(200):
                f.write(rng.integers(0, 255, 100_000).astype(np.uint8).tobytes())
    assert failed.value.errno == errno.ENOSPC and "trace.json.gz" in str(failed.value)
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["trace.json.gz"]
    assert not _threads("opscope-gzip")


def test_a_store_part_whose_writer_fails_leaves_no_file(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    from opscope.store.tables import arrow_table
    from opscope.store.write import StoreWriter

    def part(k):
        return arrow_table("stacks", {"stack_id": [k], "frames": [["f.py(1): g"]]})

    with StoreWriter(tmp_path / "s.opscope") as store:
        store.write_part("stacks", iter([part(0), part(1), part(2)]), rank=0, window=0)
        folder = tmp_path / "s.opscope" / "stacks" / "rank=0" / "window=0"
        import pyarrow.parquet as pq
        assert pq.read_table(folder / "part-0.parquet").column("stack_id").to_pylist() \
            == [0, 1, 2]

        def parts_then_error():
            yield part(0)
            raise RuntimeError("the batch could not be made")

        with pytest.raises(RuntimeError, match="could not be made"):
            store.write_part("stacks", parts_then_error(), rank=0, window=1)
        assert not (tmp_path / "s.opscope" / "stacks" / "rank=0" / "window=1").exists() or \
            os.listdir(tmp_path / "s.opscope" / "stacks" / "rank=0" / "window=1") == []
        bad = pa.table({"other": [1]})  # the wrong schema: refused by the writer's thread
        with pytest.raises((ValueError, pa.ArrowInvalid)):
            store.write_part("stacks", iter([part(0), bad, part(2)]), rank=0, window=2)
        assert not any(name.endswith(".parquet") for name in os.listdir(
            tmp_path / "s.opscope" / "stacks" / "rank=0" / "window=2"))
    assert not _threads("opscope-parquet")


@pytest.mark.parametrize("fills", ["in the rows", "in the footer"])
def test_a_store_part_on_a_full_disk_leaves_no_traceback_behind(tmp_path, monkeypatch, fills):
    """The full disk is the one error raised; the abandoned Parquet writer, collected
    later, prints nothing (pyarrow's __del__ would close it again and fail)."""
    import gc
    import io
    import sys

    pytest.importorskip("pyarrow")
    from opscope.store import part_write
    from opscope.store.tables import arrow_table

    class FullDisk(io.RawIOBase):
        def __init__(self, real):
            super().__init__()
            self.real, self.left = real, room

        def writable(self):
            return True

        def write(self, data):
            n = memoryview(data).nbytes
            if n > self.left:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.left -= n
            return self.real.write(data)

        def close(self):
            self.real.close()
            super().close()

    stacks = arrow_table("stacks", {"stack_id": list(range(50_000)),
                                    "frames": [[f"f.py({k}): g"] for k in range(50_000)]})
    (tmp_path / "whole").mkdir()
    part_write.write_files(str(tmp_path / "whole"), "stacks", 0, 0, [stacks], [])
    size = os.path.getsize(tmp_path / "whole" / "stacks" / "rank=0" / "window=0" /
                           "part-0.parquet")
    room = 4096 if fills == "in the rows" else size - 16  # the footer's last bytes
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode)))
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(OSError, match="No space left"):
        part_write.write_files(str(tmp_path), "stacks", 0, 0, [stacks], [])
    gc.collect()
    assert unraisable == []
    assert os.listdir(tmp_path / "stacks" / "rank=0" / "window=0") == []  # no temp left
