"""Write an output file atomically: all of it appears, or none of it does.

Writers stream into a temp file in the target's folder and ``os.replace`` it
onto the target once everything is written, so a reader never sees half a
file and a failure leaves neither a partial target nor the temp file behind.
A path ending in ``.gz`` is gzip-compressed on the way.

Example::

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "hello.txt")
    >>> with atomic_text_writer(path) as f:
    ...     _ = f.write("hello\\n")
    >>> open(path).read()
    'hello\\n'
    >>> os.listdir(folder)
    ['hello.txt']
"""

from __future__ import annotations

import gzip
import io
import os
from contextlib import contextmanager
from typing import BinaryIO, Iterator, TextIO, Union

PathLike = Union[str, "os.PathLike[str]"]

_BUFFER_BYTES = 1 << 20


def check_output_folder(path: PathLike) -> str:
    """Return ``path`` as a string after checking its folder exists.

    Raises ``FileNotFoundError`` naming the folder when it does not, and
    ``IsADirectoryError`` when ``path`` itself is a folder.

    >>> check_output_folder("/no/such/folder/trace.json")
    Traceback (most recent call last):
    ...
    FileNotFoundError: cannot write '/no/such/folder/trace.json': the folder '/no/such/folder' does not exist
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"cannot write {path!r}: the folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path!r}: it is a folder, expected a file path")
    return path


def _create_temp(path: str) -> tuple:
    """Open a new temp file beside ``path``; returns (fd, temp path)."""
    folder, base = os.path.split(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            # 0o666 so the final file gets the usual umask-derived mode
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


@contextmanager
def atomic_text_writer(path: PathLike, *, encoding: str = "utf-8",
                       compresslevel: int = 3, fsync: bool = False) -> Iterator[TextIO]:
    """Yield a text stream whose content replaces ``path`` when the block ends.

    The stream writes to a temp file in the same folder; on normal exit it is
    closed and moved onto ``path`` with ``os.replace``. On any exception the
    temp file is removed and the exception re-raised, leaving ``path`` as it
    was. A ``path`` ending in ``.gz`` is written gzip-compressed. ``fsync``
    also flushes the data to disk before the rename (survives power loss).

    >>> import gzip, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.txt.gz")
    >>> with atomic_text_writer(path) as f:
    ...     _ = f.write("zipped")
    >>> gzip.open(path, "rt").read()
    'zipped'
    """
    with atomic_binary_writer(path, compresslevel=compresslevel, fsync=fsync) as sink:
        text = io.TextIOWrapper(sink, encoding=encoding, newline="")
        try:
            yield text
        finally:
            text.detach()  # flushes into ``sink`` without closing it


@contextmanager
def atomic_binary_writer(path: PathLike, *, compresslevel: int = 3,
                         fsync: bool = False) -> Iterator[BinaryIO]:
    """Yield a binary stream whose content replaces ``path`` when the block ends.

    Same contract as ``atomic_text_writer``, for bytes.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with atomic_binary_writer(path) as f:
    ...     _ = f.write(b"raw")
    >>> open(path, "rb").read()
    b'raw'
    """
    path = check_output_folder(path)
    fd, tmp = _create_temp(path)
    opened: list = []  # outermost last, for cleanup
    try:
        buffered = io.BufferedWriter(io.FileIO(fd, "wb", closefd=True), _BUFFER_BYTES)
        opened.append(buffered)
        sink = buffered
        zipped = None
        if path.endswith(".gz"):
            # filename= keeps the temp name out of the gzip header
            zipped = gzip.GzipFile(filename=os.path.basename(path), mode="wb",
                                   fileobj=buffered, compresslevel=compresslevel)
            opened.append(zipped)
            sink = zipped
        yield sink
        if zipped is not None:
            opened.pop()
            zipped.close()  # writes the gzip trailer; leaves ``buffered`` open
        buffered.flush()
        if fsync:
            os.fsync(fd)
        buffered.close()
        os.replace(tmp, path)
    except BaseException:
        if not opened:
            os.close(fd)
        for stream in reversed(opened):
            try:
                stream.close()
            except Exception:  # the original error matters, not this one
                pass
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
