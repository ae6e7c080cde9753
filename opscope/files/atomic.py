"""Write an output file atomically: all of it appears, or none of it does.

``output_file(path, where, name)`` checks a destination once, at the call
(``output_path.check_output_path``), and ``OutputFile.open()`` is the one way
to write it: a stream (text, or bytes with ``binary=True``) into a temp file
in the target's folder, moved onto the target with ``os.replace`` once the
block ends, so a reader never sees half a file and a failure leaves neither a
partial target nor the temp file behind. A path ending in ``.gz`` is
gzip-compressed on the way. ``atomic_text_writer(path)`` and
``atomic_binary_writer(path)`` are the two in one call.

A node that is not a regular file is never replaced (see
``opscope.files.output_path``): a symlink's target is written (atomically,
in the target's folder), a FIFO or character device is written in place,
and anything else is refused. Every error is an ``OSError`` whose filename
is the path the caller gave, e.g. ``cannot write 'out.json': No space left
on device``; the temp file is always removed. A forked child never finishes
or removes its parent's file: its writes are dropped, and ending the block
in the child raises.

Example::

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> out = output_file(os.path.join(folder, "hello.txt"), "write_hello")
    >>> with out.open() as f:
    ...     _ = f.write("hello\\n")
    >>> open(out.path).read()
    'hello\\n'
    >>> os.listdir(folder)
    ['hello.txt']
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, BinaryIO, ContextManager, Iterator, List, Optional, TextIO, Tuple, Union

from opscope.files.gzip_stream import gzip_writer
from opscope.files.output_path import (OutputTarget, check_output_path, new_error, output_error,
                                       resolve_output)

PathLike = Union[str, "os.PathLike[str]"]

_BUFFER_BYTES = 1 << 20


_FIFO_READER_WAIT_S = 2.0  # a FIFO with no reader: wait this long, then fail (never hang)


@dataclass(frozen=True)
class OutputFile:
    """A checked destination (``output_file``): ``path``, and ``open()`` to write it."""

    path: str

    @contextmanager
    def open(self, binary: bool = False, *, encoding: str = "utf-8", compresslevel: int = 3,
             fsync: bool = False) -> Iterator[IO]:
        """Yield a stream whose content replaces ``path`` when the block ends.

        The stream writes to a temp file in the same folder; on normal exit it
        is closed and moved onto ``path`` with ``os.replace``. On any exception
        the temp file is removed and the exception re-raised, leaving ``path``
        as it was. A ``path`` ending in ``.gz`` is written gzip-compressed.
        ``fsync`` also flushes the data to disk before the rename (survives
        power loss). A FIFO or character device at ``path`` is written in place
        (there is nothing to replace atomically there).

        >>> import gzip, os, tempfile
        >>> out = output_file(os.path.join(tempfile.mkdtemp(), "x.txt.gz"))
        >>> with out.open() as f:
        ...     _ = f.write("zipped")
        >>> gzip.open(out.path, "rt").read()
        'zipped'
        >>> with output_file("/dev/null").open(binary=True) as f:
        ...     _ = f.write(b"gone")
        """
        with _binary_output(self.path, compresslevel, fsync) as sink:
            if binary:
                yield sink
                return
            text = io.TextIOWrapper(sink, encoding=encoding, newline="")
            try:
                yield text
            except BaseException:
                try:  # the data is thrown away below; only detach the wrapper
                    text.detach()
                except Exception:
                    pass
                raise
            text.detach()  # flushes into ``sink`` without closing it


def output_file(path: PathLike, where: Optional[str] = None, name: str = "path") -> OutputFile:
    """``path`` checked once as the destination of an output file (``check_output_path``).

    ``where`` and ``name`` (the function called and its argument) begin the
    errors of a bad argument; without them the errors name only the path.

    >>> output_file("/no/such/x.json", "export_stacks")
    Traceback (most recent call last):
    ...
    FileNotFoundError: export_stacks: cannot write '/no/such/x.json': the folder '/no/such' does not exist
    """
    return OutputFile(check_output_path(where, name, path))


class _RawOutput(io.FileIO):
    """A FileIO whose write and close errors name the user's path, not the fd or temp."""

    def __init__(self, fd: int, shown: str):
        super().__init__(fd, "wb", closefd=True)
        self._shown = shown
        self._owner = os.getpid()

    def write(self, data) -> int:  # type: ignore[override]
        if os.getpid() != self._owner:
            # A forked child shares this file and its offset with the parent, which
            # goes on writing it: the child's copy of the buffer is dropped.
            return memoryview(data).nbytes
        try:
            return super().write(data)
        except OSError as exc:
            raise output_error(exc, self._shown) from exc

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:
            raise output_error(exc, self._shown) from exc


def _create_temp(target: OutputTarget, folder_fd: int) -> Tuple[int, str]:
    """Open a new temp file beside the target (in ``folder_fd``); (fd, temp name)."""
    while True:
        tmp = f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            # 0o666 so a new file gets the usual umask-derived mode
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o666, dir_fd=folder_fd)
        except FileExistsError:
            continue
        if target.existing is not None:
            _keep_owner_and_mode(fd, target.existing)
        return fd, tmp


def _keep_owner_and_mode(fd: int, existing: os.stat_result) -> None:
    """Give the temp file the replaced file's permissions (and owner, as root).

    A private (0600) file must stay private. Set-id bits are never copied:
    root rewriting a user's file must not make a set-uid file it owns.
    """
    try:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            os.fchown(fd, existing.st_uid, existing.st_gid)
        os.fchmod(fd, stat.S_IMODE(existing.st_mode) & 0o777)
    except OSError:  # a best effort: the content matters more than the mode
        pass


def _open_in_place(target: OutputTarget) -> int:
    """Open a FIFO or character device for writing, without creating or truncating.

    A FIFO nobody reads would block ``open`` forever, so it is opened
    non-blocking and retried for a short while before failing with ENXIO.
    """
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    deadline = time.monotonic() + _FIFO_READER_WAIT_S
    while True:
        try:
            fd = os.open(target.target, flags)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise output_error(exc, target.shown) from exc
            if time.monotonic() >= deadline:
                raise new_error(errno.ENXIO, "no process is reading the FIFO",
                                target.shown) from None
            time.sleep(0.02)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode)):
            # it changed since we looked: never write a regular file in place
            raise new_error(errno.EAGAIN, "it changed while being opened; try again",
                            target.shown)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except OSError as exc:
        os.close(fd)
        raise output_error(exc, target.shown) from exc
    return fd


def _open_folder(target: OutputTarget) -> int:
    """The target's folder, held open so that every step below happens in it."""
    try:
        folder_fd = os.open(target.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise output_error(exc, target.shown) from exc
    try:
        now = os.stat(target.name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        now = None
    except OSError as exc:
        os.close(folder_fd)
        raise output_error(exc, target.shown) from exc
    if now is not None and not stat.S_ISREG(now.st_mode):
        os.close(folder_fd)  # swapped for a link or another node since we resolved it
        raise new_error(errno.EAGAIN, "it changed while being opened; try again",
                        target.shown)
    return folder_fd


def atomic_text_writer(path: PathLike, *, encoding: str = "utf-8", compresslevel: int = 3,
                       fsync: bool = False) -> ContextManager[TextIO]:
    """``output_file(path).open()``: a text stream whose content replaces ``path``.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.txt")
    >>> with atomic_text_writer(path) as f:
    ...     _ = f.write("text")
    >>> open(path).read()
    'text'
    """
    return output_file(path).open(encoding=encoding, compresslevel=compresslevel, fsync=fsync)


def atomic_binary_writer(path: PathLike, *, compresslevel: int = 3,
                         fsync: bool = False) -> ContextManager[BinaryIO]:
    """``output_file(path).open(binary=True)``: a binary stream that replaces ``path``.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with atomic_binary_writer(path) as f:
    ...     _ = f.write(b"raw")
    >>> open(path, "rb").read()
    b'raw'
    """
    return output_file(path).open(binary=True, compresslevel=compresslevel, fsync=fsync)


@contextmanager
def _binary_output(path: str, compresslevel: int, fsync: bool) -> Iterator[BinaryIO]:
    """The binary stream of ``OutputFile.open``, for a ``path`` checked already."""
    target = resolve_output(path)
    fd, folder_fd, tmp = _open_output(path, target)
    opened: List = []  # outermost last, for cleanup
    in_body = False  # an OSError from the caller's own code is not relabelled
    owner = os.getpid()  # a forked child must not touch the parent's unfinished file
    try:
        raw = _RawOutput(fd, path)
        opened.append(raw)
        buffered = io.BufferedWriter(raw, _BUFFER_BYTES)
        opened.append(buffered)
        sink = buffered
        zipped = None
        if path.endswith(".gz"):
            # filename= keeps the temp name out of the gzip header
            zipped = gzip_writer(os.path.basename(target.target), buffered, compresslevel)
            opened.append(zipped)
            sink = zipped
        in_body = True
        yield sink
        in_body = False
        if zipped is not None:
            opened.pop()
            zipped.close()  # writes the gzip trailer; leaves ``buffered`` open
        if os.getpid() != owner:
            raise RuntimeError(f"cannot write {path!r}: the write was begun by process "
                               f"{owner}, and this is a forked child of it")
        buffered.flush()
        if fsync and tmp is not None:
            os.fsync(fd)
        buffered.close()
        if tmp is not None:
            os.replace(tmp, target.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            tmp = None
    except BaseException as exc:
        if os.getpid() != owner:
            tmp = None  # the parent's temp file: the parent finishes or removes it
        _discard(opened, fd, tmp, folder_fd)
        if isinstance(exc, OSError) and not in_body:
            raise output_error(exc, path) from exc
        raise
    finally:
        if folder_fd >= 0:
            os.close(folder_fd)


def _open_output(path: str, target: OutputTarget) -> Tuple[int, int, Optional[str]]:
    """(fd to write, folder fd or -1, temp file name or None) for ``target``."""
    if target.kind == "device":
        return _open_in_place(target), -1, None
    folder_fd = _open_folder(target)
    try:
        fd, tmp = _create_temp(target, folder_fd)
    except OSError as exc:
        os.close(folder_fd)
        raise output_error(exc, path) from exc
    return fd, folder_fd, tmp


def _discard(opened: List, fd: int, tmp: Optional[str], folder_fd: int) -> None:
    """Close what was opened (or ``fd``) and remove the unfinished temp file, quietly."""
    if not opened:
        _close_quietly(fd)
    for stream in reversed(opened):
        try:
            stream.close()  # a second close of a closed stream does nothing
        except Exception:  # the original error matters, not this one
            pass
    if tmp is not None:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except OSError:
            pass


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
