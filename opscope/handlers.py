"""``on_trace_ready`` handlers: each writes one output format per ready window.

``HANDLER_FORMATS`` names, per handler, the format it writes (an entry of
``opscope.outputs.FORMATS``) and its file suffix; the handler writes it
with ``prof.export(path, format=name)``.

A handler never stops training: a window it cannot write (a full or read-only
disk, a folder it cannot create) warns once per handler, in one line naming the
folder and the error, and ``prof.step()`` goes on; the window stays in memory
for ``prof.export_*`` to another path. (A user's own ``on_trace_ready`` that
raises still raises from ``step()``, as torch does.)

Example::

    >>> import tempfile, os
    >>> handler = tensorboard_trace_handler(tempfile.mkdtemp(), worker_name="w0")
    >>> callable(handler)
    True
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from typing import Callable, Optional

from opscope.arguments import check_bool, check_path, check_type

# handler -> (format written: a name in opscope.outputs.FORMATS, file suffix)
HANDLER_FORMATS = {
    "tensorboard_trace_handler": ("chrome_trace", ".pt.trace.json"),
    "report_handler": ("report", ".report.html"),
}


def _write(prof, handler: str, path: str) -> None:
    """Write ``handler``'s format of ``prof``'s ready window to ``path``."""
    prof.export(path, format=HANDLER_FORMATS[handler][0])


def tensorboard_trace_handler(dir_name: str, worker_name: Optional[str] = None,
                              use_gzip: bool = False) -> Callable:
    """Write each ready trace as ``{worker}.{time_ns}.pt.trace.json[.gz]`` in ``dir_name``.

    ``worker_name`` defaults to ``{hostname}_{pid}``. The folder is created on
    the first trace; if that fails, the error names it. A bad ``dir_name``
    (``''``, not a path, an existing file) fails here, at the call.

    >>> tensorboard_trace_handler("")
    Traceback (most recent call last):
    ...
    ValueError: tensorboard_trace_handler: dir_name must be a non-empty file path, got ''
    """
    folder = _check_folder("tensorboard_trace_handler", dir_name)
    check_type("tensorboard_trace_handler", "worker_name", worker_name, (str, type(None)),
               "a str or None")
    use_gzip = check_bool("tensorboard_trace_handler", "use_gzip", use_gzip)

    def write(prof) -> None:
        nonlocal worker_name
        _ensure_folder(folder)
        if not worker_name:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        suffix = HANDLER_FORMATS["tensorboard_trace_handler"][1]
        file_name = f"{worker_name}.{time.time_ns()}{suffix}"
        if use_gzip:
            file_name += ".gz"
        _write(prof, "tensorboard_trace_handler", os.path.join(folder, file_name))

    return _never_fatal("tensorboard_trace_handler", folder, write)


def report_handler(dir_name: str, worker_name: Optional[str] = None) -> Callable:
    """Write each ready window's HTML report as ``{worker}.{time_ns}.report.html`` in ``dir_name``.

    Like :func:`tensorboard_trace_handler`, but the file is the self-contained
    report (``prof.export_report``). ``worker_name`` defaults to ``{hostname}_{pid}``.

    >>> import tempfile
    >>> callable(report_handler(tempfile.mkdtemp()))
    True
    """
    folder = _check_folder("report_handler", dir_name)
    check_type("report_handler", "worker_name", worker_name, (str, type(None)),
               "a str or None")

    def write(prof) -> None:
        _ensure_folder(folder)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        suffix = HANDLER_FORMATS["report_handler"][1]
        _write(prof, "report_handler", os.path.join(folder, f"{worker}.{time.time_ns()}{suffix}"))

    return _never_fatal("report_handler", folder, write)


def store_handler(dir_name: str) -> Callable:
    """Append each ready window to the opscope store in ``dir_name`` (created when missing).

    Windows are numbered 0, 1, ... per rank; under torchrun each rank writes
    its own partitions of the one store (its ``distributedInfo.rank``). A
    ``dir_name`` that exists and is not a store, or a missing pyarrow, fails
    here, at the call; a window that cannot be written later warns in one
    line and the job goes on. See ``prof.export_store`` and ``opscope query``.

    >>> import tempfile
    >>> callable(store_handler(tempfile.mkdtemp()))
    True
    """
    from opscope.store.folder import check_store_folder
    from opscope.store.schema import require_pyarrow

    folder = _check_folder("store_handler", dir_name)
    require_pyarrow()
    check_store_folder(folder, create=True)

    def write(prof) -> None:
        prof.export_store(folder)

    return _never_fatal("store_handler", folder, write)


def _never_fatal(name: str, folder: str, write: Callable) -> Callable:
    """``write(prof)`` as a handler that never raises an ``Exception`` into ``step()``.

    The first failure warns in one line (the handler, the folder, the error);
    later ones are counted in ``handler.failures`` without a warning each step.

    >>> def full_disk(prof): raise OSError(28, "No space left on device")
    >>> h = _never_fatal("demo_handler", "/out", full_disk)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     h(None); h(None)
    >>> len(caught), h.failures
    (1, 2)
    """
    def handler(prof) -> None:
        try:
            write(prof)
        except Exception as exc:  # never harm the job: warn once, keep the window, go on
            handler.failures += 1
            if handler.failures == 1:
                text = " ".join(str(exc).split()) or type(exc).__name__
                warnings.warn(f"opscope: {name} could not write a window to {folder!r}: "
                              f"{text}; training goes on, the window stays in memory for "
                              f"prof.export_*, and later failures of this handler are not "
                              f"reported", stacklevel=2)

    handler.failures = 0
    return handler


def _check_folder(where: str, dir_name) -> str:
    """``dir_name`` as a str: a path that is a folder or does not exist yet."""
    folder = check_path(where, "dir_name", dir_name)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise NotADirectoryError(f"{where}: dir_name {folder!r} exists and is not a folder; "
                                 f"expected a folder for the trace files")
    return folder


def _ensure_folder(folder: str) -> None:
    if not os.path.isdir(folder):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise RuntimeError(f"Can't create directory: {folder} ({exc.strerror or exc})") \
                from exc
