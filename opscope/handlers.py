"""``on_trace_ready`` handlers: each writes one output format per ready window.

``HANDLER_FORMATS`` names, per handler, the format it writes (an entry of
``opscope.export.formats.FORMATS``) and its file suffix; the handler writes it
with ``prof.export(path, format=name)``.

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

# handler -> (format written: a name in opscope.export.formats.FORMATS, file suffix)
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

    def handler(prof) -> None:
        nonlocal worker_name
        _ensure_folder(folder)
        if not worker_name:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        suffix = HANDLER_FORMATS["tensorboard_trace_handler"][1]
        file_name = f"{worker_name}.{time.time_ns()}{suffix}"
        if use_gzip:
            file_name += ".gz"
        _write(prof, "tensorboard_trace_handler", os.path.join(folder, file_name))

    return handler


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

    def handler(prof) -> None:
        _ensure_folder(folder)
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        suffix = HANDLER_FORMATS["report_handler"][1]
        _write(prof, "report_handler", os.path.join(folder, f"{worker}.{time.time_ns()}{suffix}"))

    return handler


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

    def handler(prof) -> None:
        try:
            prof.export_store(folder)
        except Exception as exc:  # never harm the job: warn, keep training
            text = " ".join(str(exc).split()) or type(exc).__name__
            warnings.warn(f"opscope: store_handler could not write a window to {folder!r}: "
                          f"{text}", stacklevel=2)

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
