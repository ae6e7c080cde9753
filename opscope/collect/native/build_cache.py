"""The on-disk cache of compiled observers: trust checks, stamps, the build lock, and
the part of a build's key (its cache folder) that a source's own headers make.

Other local users are treated as attackers. A cache folder or file is used only
when the current user owns it, nobody else can write to it, and (inside the
cache) it is not a symlink. A published ``.so`` carries a stamp with its size
and sha256, and is loaded only when it matches, so a truncated copy (full disk,
killed copy) is rebuilt instead of crashing the process with SIGBUS.

Example::

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> folder = trusted_folder(root / "k", create=True)
    >>> so = folder / "m.so"; _ = so.write_bytes(b"ELF")
    >>> write_stamp(so, b"ELF")
    >>> verified_bytes(so) == b"ELF"
    True
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Callable, Optional


def headers_options(folder: Path) -> dict:
    """Build options for a source whose own headers (``*.h``) lie in ``folder``: that
    folder to include, and a build-key part hashing each header's name and bytes (never
    the folder's path), so that an edit to any header makes a build of its own.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.h").write_text("int a;")
    >>> first = headers_options(folder)["key"]
    >>> _ = (folder / "a.h").write_text("int b;")
    >>> headers_options(folder)["key"] != first
    True
    """
    digest = hashlib.sha256()
    for header in sorted(Path(folder).glob("*.h")):
        data = header.read_bytes()
        digest.update(f"{header.name}\0{len(data)}\0".encode() + data)
    return {"include_dirs": [str(folder)], "key": digest.hexdigest()}


class UntrustedCache(RuntimeError):
    """A cache folder or file that another user could have written: never used."""


class StaleBuild(RuntimeError):
    """A cached build that is missing or does not match its stamp: rebuild it."""


def _check_stat(st: os.stat_result, path: Path) -> None:
    if st.st_uid != os.geteuid():
        raise UntrustedCache(f"{path} is owned by uid {st.st_uid}, not by you "
                             f"(uid {os.geteuid()}); refusing to use it")
    if st.st_mode & 0o022:
        raise UntrustedCache(f"{path} can be written by group or others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); refusing to use it "
                             f"(chmod go-w it)")


def trusted_root(root: Path, create: bool) -> Path:
    """Check the cache root (created 0700 when missing and ``create``).

    The root itself may be a symlink the user made (e.g. ``~/.cache`` on another
    disk); then the link must be the user's too, and its target is checked.
    """
    if create and not os.path.lexists(root):
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StaleBuild(f"cannot create the cache folder {root}: {exc.strerror}") from None
    try:
        link = os.lstat(root)
        target = os.stat(root)
    except FileNotFoundError:
        raise StaleBuild(f"the cache folder {root} does not exist") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid != os.geteuid():
        raise UntrustedCache(f"{root} is a symlink owned by uid {link.st_uid}, not by you; "
                             "refusing to use it")
    if not stat.S_ISDIR(target.st_mode):
        raise UntrustedCache(f"{root} is not a folder; refusing to use it")
    _check_stat(target, root)
    return root


def trusted_folder(folder: Path, create: bool) -> Path:
    """Check a folder inside the cache: ours, not a symlink, not writable by others."""
    if create:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StaleBuild(f"cannot create {folder}: {exc.strerror}") from None
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise StaleBuild(f"{folder} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCache(f"{folder} is a symlink opscope did not make; refusing to use it")
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedCache(f"{folder} is not a folder; refusing to use it")
    _check_stat(st, folder)
    return folder


def _read_trusted(path: Path) -> bytes:
    """The bytes of a regular file of ours, opened without following a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StaleBuild(f"{path} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedCache(f"{path} is a symlink opscope did not make; "
                                 "refusing to use it") from None
        raise StaleBuild(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedCache(f"{path} is not a regular file; refusing to use it")
        _check_stat(st, path)
        return handle.read()


def stamp_path(so: Path) -> Path:
    """Where the stamp of ``so`` lives: ``name.so`` -> ``name.stamp``."""
    return so.with_suffix(".stamp")


def verified_bytes(so: Path) -> bytes:
    """The contents of ``so`` when it matches its stamp.

    UntrustedCache when either file could come from another user; StaleBuild
    when one is missing or they disagree (a truncated or half-published build).
    """
    stamp_file = stamp_path(so)
    try:
        stamp = json.loads(_read_trusted(stamp_file))
        size, digest = int(stamp["size"]), str(stamp["sha256"])
    except (ValueError, KeyError, TypeError):
        raise StaleBuild(f"{stamp_file} is not a valid stamp") from None
    data = _read_trusted(so)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise StaleBuild(f"{so} does not match its stamp ({len(data)} bytes, "
                         f"stamp says {size})")
    return data


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a private temp file beside ``path``, then os.replace it into place."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def write_stamp(so: Path, data: bytes) -> None:
    """Record the size and sha256 of ``so`` (whose contents are ``data``)."""
    stamp = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_atomic(stamp_path(so), json.dumps(stamp).encode())


def publish(so: Path, data: bytes) -> None:
    """Put a freshly built library into the cache: the .so first, then its stamp.

    A run killed between the two leaves a .so whose stamp does not match, which
    the next run rebuilds.
    """
    _write_atomic(so, data)
    write_stamp(so, data)


# Lock fds held by this process. A forked child (a DataLoader worker, say) would
# otherwise share the lock and keep it held after the builder dies.
_held_fds: set = set()


def _close_held_in_child() -> None:
    for fd in list(_held_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _held_fds.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


class BuildLock:
    """An exclusive ``flock`` on ``folder/.lock``; the OS drops it when its holder dies.

    A forked child does not keep it: the fd is closed in the child at fork.

    ``acquire(wait_s, on_wait)`` returns True when held, False after ``wait_s``
    seconds of another live process holding it (``on_wait`` is called once,
    when the wait starts).
    """

    def __init__(self, folder: Path):
        self.path = folder / ".lock"
        self._fd: Optional[int] = None

    def acquire(self, wait_s: float, on_wait: Callable[[], None]) -> bool:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UntrustedCache(f"{self.path} is a symlink opscope did not make; "
                                     "refusing to use it") from None
            raise StaleBuild(f"cannot open the build lock {self.path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UntrustedCache(f"{self.path} is not a regular file; refusing to use it")
            _check_stat(st, self.path)
            deadline = time.monotonic() + wait_s
            waited = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        waited = True
                        on_wait()
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return False
                    time.sleep(0.2)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _held_fds.add(fd)
        return True

    def release(self) -> None:
        if self._fd is not None:
            _held_fds.discard(self._fd)
            os.close(self._fd)  # closing drops the flock
            self._fd = None
