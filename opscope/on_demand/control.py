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

import json
import os
import stat
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

from opscope.export.atomic import atomic_text_writer

CONTROL_DIR_ENV = "OPSCOPE_ON_DEMAND_DIR"
_REQUEST_SUFFIX = ".request.json"
_RESULT_SUFFIX = ".result.json"


def control_dir(create: bool = True) -> str:
    """The private control folder; created (mode 0700) when ``create``.

    Raises ``PermissionError`` when it belongs to another user or others can
    write to it: requests found there could not be trusted.
    """
    folder = os.environ.get(CONTROL_DIR_ENV) or os.path.join(
        tempfile.gettempdir(), f"opscope-on-demand-{_uid()}")
    if create:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.path.isdir(folder) and hasattr(os, "getuid"):
        info = os.stat(folder)
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(
                f"on-demand control folder {folder!r} belongs to another user or is writable "
                f"by others; remove it or set {CONTROL_DIR_ENV} to a private folder")
    return folder


def _uid() -> str:
    return str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")


def _write_json(path: str, value: Dict[str, Any]) -> str:
    with atomic_text_writer(path) as f:
        json.dump(value, f)
    return path


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


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
    """True when a process ``pid`` exists (whoever owns it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- registration (written by the training process) -------------------------------------------
def registration_path(pid: int) -> str:
    return os.path.join(control_dir(), f"{int(pid)}.json")


def register(pid: int, signal_number: int) -> str:
    """Announce that ``pid`` serves on-demand requests on ``signal_number``.

    Files left by processes that no longer exist (answers nobody waited
    for, say) are removed on the way.
    """
    remove_files_of_dead_processes()
    return _write_json(registration_path(pid), {
        "pid": int(pid), "signal": int(signal_number),
        "start_time": process_start_time(pid), "registered": time.time(),
    })


def remove_files_of_dead_processes() -> int:
    """Delete control files whose pid is gone; returns how many."""
    folder = control_dir()
    removed = 0
    for name in os.listdir(folder):
        head = name.split(".", 1)[0]
        if head.isdigit() and not process_exists(int(head)):
            try:
                os.unlink(os.path.join(folder, name))
                removed += 1
            except OSError:
                pass
    return removed


def unregister(pid: int) -> None:
    """Withdraw ``pid``'s registration (no error when there is none)."""
    try:
        os.unlink(registration_path(pid))
    except OSError:
        pass


def read_registration(pid: int) -> Optional[Dict[str, Any]]:
    """``pid``'s registration, or None when it has none or it is stale.

    Stale: the process is gone, or the pid now belongs to a process started
    later than the one that registered. A stale file is removed.
    """
    path = registration_path(pid)
    record = _read_json(path)
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


def request_path(pid: int, request_id: str) -> str:
    return os.path.join(control_dir(), f"{int(pid)}.{request_id}{_REQUEST_SUFFIX}")


def write_request(pid: int, request: Dict[str, Any]) -> str:
    """Leave ``request`` for ``pid``; returns the file's path."""
    return _write_json(request_path(pid, request["id"]), request)


def withdraw_request(pid: int, request_id: str) -> bool:
    """Remove a request not yet taken; True when it was still there."""
    try:
        os.unlink(request_path(pid, request_id))
        return True
    except OSError:
        return False


def take_requests(pid: int) -> List[Dict[str, Any]]:
    """Remove and return every request for ``pid``, oldest first."""
    folder = control_dir()
    prefix = f"{int(pid)}."
    taken = []
    for name in os.listdir(folder):
        if not (name.startswith(prefix) and name.endswith(_REQUEST_SUFFIX)):
            continue
        path = os.path.join(folder, name)
        request = _read_json(path)
        try:
            os.unlink(path)
        except OSError:
            continue  # taken by someone else meanwhile
        if request is not None and "id" in request:
            taken.append(request)
    taken.sort(key=lambda r: r.get("created", 0))
    return taken


# -- results (written by the training process) ------------------------------------------------
def result_path(pid: int, request_id: str) -> str:
    return os.path.join(control_dir(), f"{int(pid)}.{request_id}{_RESULT_SUFFIX}")


def write_result(pid: int, request_id: str, **fields: Any) -> str:
    """Answer a request: ``status="ok", trace=...`` or ``status="error", message=...``."""
    return _write_json(result_path(pid, request_id), {"id": request_id, **fields})


def take_result(pid: int, request_id: str) -> Optional[Dict[str, Any]]:
    """The answer to a request, removed from the folder; None while there is none."""
    path = result_path(pid, request_id)
    result = _read_json(path)
    if result is not None:
        try:
            os.unlink(path)
        except OSError:
            pass
    return result
