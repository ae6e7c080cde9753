"""The on-demand control folder: how ``opscope trigger`` and a training process talk.

Everything is a small JSON file in one private folder per user
(``$OPSCOPE_ON_DEMAND_DIR``, default ``<tmp>/opscope-on-demand-<uid>``, mode
0700). No network port is opened.

- ``<pid>.json``: written by a process that enabled on-demand profiling: its
  pid, the signal it listens on and its start time (so a reused pid is not
  taken for it).
- ``<pid>.<id>.request.json``: written by ``opscope trigger`` before it sends
  the signal: how many steps, which folder, which options.
- ``<pid>.<id>.result.json``: written by the process when the trace is on
  disk (``status`` ``"ok"`` and ``trace``) or when it cannot serve the request
  (``status`` ``"error"`` and ``message``).

Every file is written atomically, so a reader never sees half of one.

Other local users are assumed hostile. The folder is created with
``os.mkdir`` (never through a symlink) and used only through a directory fd
opened with ``O_NOFOLLOW`` and checked with ``fstat``: a real folder, ours,
mode 0700; anything else is refused with :class:`ControlFolderError`. Files
are created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (mode 0600) under a private
temporary name and renamed in place; they are read without following
symlinks and at most :data:`MAX_FILE_BYTES` of them. opscope removes only
regular files of its own that carry one of the exact names above.

Example::

    >>> import os, tempfile
    >>> os.environ["OPSCOPE_ON_DEMAND_DIR"] = tempfile.mkdtemp()
    >>> _ = register(os.getpid(), 12)
    >>> read_registration(os.getpid())["signal"]
    12
    >>> req = new_request(steps=3, output_dir="/tmp/traces")
    >>> _ = write_request(os.getpid(), req)
    >>> [r["steps"] for r in take_requests(os.getpid())]
    [3]
    >>> take_requests(os.getpid())
    []
    >>> unregister(os.getpid()); read_registration(os.getpid()) is None
    True
    >>> del os.environ["OPSCOPE_ON_DEMAND_DIR"]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional

CONTROL_DIR_ENV = "OPSCOPE_ON_DEMAND_DIR"
MAX_FILE_BYTES = 64 * 1024  # a request or a result is a few hundred bytes
_REQUEST_SUFFIX = ".request.json"
_RESULT_SUFFIX = ".result.json"
_ID = r"[0-9a-f]{6,32}"
REQUEST_ID = re.compile(_ID)
# the only names opscope ever removes from the folder
_OWN_NAME = re.compile(rf"(\d+)\.json"
                       rf"|(\d+)\.{_ID}\.(?:request|result)\.json"
                       rf"|\.(\d+)\.[0-9a-f]{{16}}\.tmp")


class ControlFolderError(PermissionError):
    """The control folder cannot be trusted (a symlink, not ours, not private)."""


def control_dir(create: bool = True) -> str:
    """The private control folder's path; created (mode 0700) when ``create``.

    Raises :class:`ControlFolderError` (one line, naming the folder) when it
    is a symlink, not a folder, belongs to another user or others may use it:
    requests found there could not be trusted, nor could files be removed.
    """
    folder = _folder_path()
    if create:
        _make_folder(folder)
    try:
        with _open_folder(folder):
            pass
    except FileNotFoundError:
        if create:
            raise
    return folder


def _folder_path() -> str:
    return os.environ.get(CONTROL_DIR_ENV) or os.path.join(
        tempfile.gettempdir(), f"opscope-on-demand-{os.getuid()}")


def _make_folder(folder: str) -> None:
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):  # only for a $OPSCOPE_ON_DEMAND_DIR of the user's choice
        os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)  # never follows a symlink planted at that path
    except FileExistsError:
        return  # checked by _open_folder, whatever it is
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, 0o700)  # a umask may have taken bits away
    finally:
        os.close(fd)


def _refuse(folder: str, why: str) -> ControlFolderError:
    return ControlFolderError(
        f"on-demand control folder {folder!r} {why}; expected a folder of uid {os.getuid()} "
        f"with mode 0700; remove it or set {CONTROL_DIR_ENV} to a private folder")


@contextlib.contextmanager
def _open_folder(folder: Optional[str] = None) -> Iterator[int]:
    """A checked fd of the control folder; every file operation goes through it."""
    folder = folder or _folder_path()
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        if os.path.islink(folder):
            raise _refuse(folder, "is a symlink") from None
        raise _refuse(folder, f"cannot be opened as a folder ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode):
            raise _refuse(folder, "is not a folder")
        if info.st_uid != os.getuid():
            raise _refuse(folder, f"belongs to uid {info.st_uid}")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise _refuse(folder, f"has mode {stat.S_IMODE(info.st_mode):04o} (others may use it)")
        yield fd
    finally:
        os.close(fd)


def _write_json(name: str, value: Dict[str, Any]) -> str:
    """Write ``name`` in the folder: private temp file, then rename; nothing is followed."""
    data = json.dumps(value).encode("utf-8")
    _make_folder(_folder_path())
    with _open_folder() as fd:
        temp = f".{os.getpid()}.{uuid.uuid4().hex[:16]}.tmp"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                      dir_fd=fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
            finally:
                os.close(out)
            os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=fd)
            raise
    return os.path.join(_folder_path(), name)


def _read_json(fd: int, name: str) -> Optional[Dict[str, Any]]:
    """The JSON object in ``name``; None unless it is our regular file of bounded size."""
    try:
        file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:  # missing, or a symlink (ELOOP)
        return None
    try:
        info = os.fstat(file_fd)
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                or info.st_size > MAX_FILE_BYTES):
            return None
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(file_fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:
            return None
        value = json.loads(b"".join(chunks).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(file_fd)
    return value if isinstance(value, dict) else None


def _remove_own(fd: int, name: str) -> bool:
    """Unlink ``name`` if it has one of our exact names and is a regular file of ours."""
    if not _OWN_NAME.fullmatch(name):
        return False
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return False
        os.unlink(name, dir_fd=fd)
    except OSError:
        return False
    return True


def process_start_time(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot (Linux); None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        # the command name (field 2) may hold spaces and parentheses: split after its last ')'
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_exists(pid: int) -> bool:
    """True when a process ``pid`` exists (whoever owns it) and has not exited.

    A zombie (exited, not yet reaped by its parent) does not count: it will
    never answer a request.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _process_state(pid) not in ("Z", "X")


def _process_state(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        return text[text.rindex(")") + 2:].split()[0]
    except (OSError, ValueError, IndexError):
        return None


# -- registration (written by the training process) -------------------------------------------
def _registration_name(pid: int) -> str:
    return f"{int(pid)}.json"


def registration_path(pid: int) -> str:
    return os.path.join(control_dir(), _registration_name(pid))


def register(pid: int, signal_number: int) -> str:
    """Announce that ``pid`` serves on-demand requests on ``signal_number``.

    Files left by processes that no longer exist (answers nobody waited
    for, say) are removed on the way.
    """
    control_dir()  # created, or refused with a one-line ControlFolderError
    remove_files_of_dead_processes()
    return _write_json(_registration_name(pid), {
        "pid": int(pid), "signal": int(signal_number),
        "start_time": process_start_time(pid), "registered": time.time(),
    })


def remove_files_of_dead_processes() -> int:
    """Delete our control files whose pid is gone; returns how many.

    Only exact names of ours (``<pid>.json``, ``<pid>.<id>.request.json``,
    ``<pid>.<id>.result.json``, ``.<pid>.<hex>.tmp``) that are regular files
    owned by us; nothing else in the folder is touched.
    """
    removed = 0
    with _open_folder() as fd:
        for name in os.listdir(fd):
            match = _OWN_NAME.fullmatch(name)
            if match is None:
                continue
            pid = int(next(g for g in match.groups() if g is not None))
            if not process_exists(pid) and _remove_own(fd, name):
                removed += 1
    return removed


def unregister(pid: int) -> None:
    """Withdraw ``pid``'s registration (no error when there is none)."""
    with contextlib.suppress(FileNotFoundError), _open_folder() as fd:
        _remove_own(fd, _registration_name(pid))


def read_registration(pid: int) -> Optional[Dict[str, Any]]:
    """``pid``'s registration, or None when it has none or it is stale.

    Stale: the process is gone, or the pid now belongs to a process started
    later than the one that registered. A stale file is removed.
    """
    try:
        with _open_folder() as fd:
            record = _read_json(fd, _registration_name(pid))
    except FileNotFoundError:
        return None
    if record is None:
        return None
    started = record.get("start_time")
    if not process_exists(pid) or (started is not None and process_start_time(pid) != started):
        unregister(pid)
        return None
    return record


# -- requests (written by opscope trigger) ----------------------------------------------------
def new_request(steps: int, output_dir: str, options: Optional[Dict[str, bool]] = None,
                gzip: bool = False) -> Dict[str, Any]:
    """A request to profile ``steps`` optimizer steps into ``output_dir`` (made absolute)."""
    if int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return {"id": uuid.uuid4().hex[:12], "steps": int(steps),
            "output_dir": os.path.abspath(output_dir), "options": dict(options or {}),
            "gzip": bool(gzip), "created": time.time()}


def _file_name(pid: int, request_id: str, suffix: str) -> str:
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        raise ValueError(f"on-demand request id {request_id!r}: expected 6 to 32 hex digits")
    return f"{int(pid)}.{request_id}{suffix}"


def request_path(pid: int, request_id: str) -> str:
    return os.path.join(control_dir(), _file_name(pid, request_id, _REQUEST_SUFFIX))


def write_request(pid: int, request: Dict[str, Any]) -> str:
    """Leave ``request`` for ``pid``; returns the file's path."""
    return _write_json(_file_name(pid, request["id"], _REQUEST_SUFFIX), request)


def withdraw_request(pid: int, request_id: str) -> bool:
    """Remove a request not yet taken; True when it was still there."""
    name = _file_name(pid, request_id, _REQUEST_SUFFIX)
    try:
        with _open_folder() as fd:
            return _remove_own(fd, name)
    except FileNotFoundError:
        return False


def take_requests(pid: int) -> List[Dict[str, Any]]:
    """Remove and return every request for ``pid``, oldest first.

    A file of the right name that is not our regular file (a symlink, a
    FIFO) is neither read through nor removed.
    """
    pattern = re.compile(rf"{int(pid)}\.({_ID}){re.escape(_REQUEST_SUFFIX)}")
    taken = []
    with _open_folder() as fd:
        for name in os.listdir(fd):
            match = pattern.fullmatch(name)
            if match is None:
                continue
            request = _read_json(fd, name)
            if request is None or not _remove_own(fd, name):
                continue  # not ours, unreadable, or taken by someone else meanwhile
            request["id"] = match.group(1)  # the name, checked, is what the answer uses
            taken.append(request)
    taken.sort(key=lambda r: r.get("created", 0) if isinstance(r.get("created"), (int, float))
               else 0)
    return taken


# -- results (written by the training process) ------------------------------------------------
def result_path(pid: int, request_id: str) -> str:
    return os.path.join(control_dir(), _file_name(pid, request_id, _RESULT_SUFFIX))


def write_result(pid: int, request_id: str, **fields: Any) -> str:
    """Answer a request: ``status="ok", trace=...`` or ``status="error", message=...``."""
    return _write_json(_file_name(pid, request_id, _RESULT_SUFFIX), {"id": request_id, **fields})


def take_result(pid: int, request_id: str) -> Optional[Dict[str, Any]]:
    """The answer to a request, removed from the folder; None while there is none."""
    name = _file_name(pid, request_id, _RESULT_SUFFIX)
    try:
        with _open_folder() as fd:
            result = _read_json(fd, name)
            if result is not None:
                _remove_own(fd, name)
    except FileNotFoundError:
        return None
    return result
