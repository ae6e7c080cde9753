"""``ExecutionTraceObserver``: torch.profiler's execution-trace API, on our observer.

Example::

    >>> import os, tempfile, torch, opscope
    >>> path = os.path.join(tempfile.mkdtemp(), "et.json")
    >>> et = opscope.ExecutionTraceObserver().register_callback(path)
    >>> et.start()
    >>> _ = torch.ones(4) + 1
    >>> et.stop()
    >>> et.unregister_callback()      # writes et.json (torch's ET schema)
    >>> load_execution_trace(path)["schema"]
    '1.1.1-chakra.0.0.4'
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from opscope.files import output_file


class ExecutionTraceObserver:
    """Records an execution trace: every op, its inputs and outputs, with tensor ids.

    One may be registered per process. ``register_callback(path)`` installs a
    RecordFunction callback (disabled); ``start()`` and ``stop()`` choose when
    ops are recorded; ``unregister_callback()`` (or ``cleanup()``, or garbage
    collection) removes the callback and writes ``path``. Passed to
    ``opscope.profile(execution_trace_observer=...)``, it records exactly the
    profiler's active windows and is cleaned up when the profiler exits.

    >>> import os, tempfile, torch, opscope
    >>> path = os.path.join(tempfile.mkdtemp(), "et.json")
    >>> sched = opscope.schedule(wait=1, warmup=1, active=2)
    >>> et = opscope.ExecutionTraceObserver().register_callback(path)
    >>> with opscope.profile(schedule=sched, execution_trace_observer=et) as prof:
    ...     for _ in range(4):
    ...         _ = torch.ones(2) + 1
    ...         prof.step()
    >>> et.is_registered        # the profiler cleaned it up: the file is written
    False
    >>> sorted({n["name"] for n in load_execution_trace(path)["nodes"]} & {"ProfilerStep#2"})
    ['ProfilerStep#2']
    """

    def __init__(self) -> None:
        self._registered = False
        self._execution_trace_running = False
        self._output_file_path = ""
        self._collector: Any = None
        self._writer: Any = None

    def __del__(self) -> None:
        try:
            self.unregister_callback()
        except Exception:  # interpreter shutdown or a failed write: nothing to tell
            pass

    def register_callback(self, output_file_path: str) -> "ExecutionTraceObserver":
        """Install the callback; the trace will be written to ``output_file_path``.

        Returns ``self``. A second call while registered does nothing. Raises
        ``RuntimeError`` when the native observer cannot be built or another
        observer is registered. A bad ``output_file_path`` fails here: TypeError
        for a non-path, ValueError for ``''``, IsADirectoryError for a folder,
        FileNotFoundError when its folder does not exist, and an ``OSError``
        naming it when its temp file cannot be created (permission denied, a
        read-only file system).
        """
        destination = output_file(output_file_path, "ExecutionTraceObserver.register_callback",
                                  "output_file_path")
        if self._registered:
            return self
        from opscope.collect.native.execution_trace import NodeCollector
        from opscope.execution_trace.writer import ExecutionTraceWriter

        collector = NodeCollector.load()
        collector.register()
        try:
            writer = ExecutionTraceWriter(destination)
        except BaseException:
            collector.unregister()
            raise
        self._collector, self._writer = collector, writer
        self._output_file_path = destination.path
        self._registered = True
        _registered_observers.add(self)
        return self

    def unregister_callback(self) -> None:
        """Stop, remove the callback and write the output file (atomically)."""
        if not self._registered:
            return
        try:
            self.stop()
        finally:
            collector, writer = self._collector, self._writer
            self._collector = self._writer = None
            self._registered = False
            try:
                writer.write_nodes(collector.take_nodes())
            finally:
                collector.unregister()
                if writer is not None:
                    _finish_or_abandon(writer)

    @property
    def is_registered(self) -> bool:
        """True between ``register_callback()`` and ``unregister_callback()``."""
        return self._registered

    def is_running(self) -> bool:
        """True between ``start()`` and ``stop()``."""
        return self._execution_trace_running

    def start(self) -> None:
        """Start recording ops (does nothing unless registered, or if running)."""
        if self._registered and not self._execution_trace_running:
            self._collector.enable()
            self._execution_trace_running = True

    def stop(self) -> None:
        """Stop recording ops; what was recorded goes to the (unfinished) file.

        A write error (a full disk) is raised here, once, naming the output
        path; the temp file is removed and later calls write nothing.
        """
        if not self._execution_trace_running:
            return
        self._execution_trace_running = False
        self._collector.disable()
        self._writer.write_nodes(self._collector.take_nodes())

    def cleanup(self) -> None:
        """Same as ``unregister_callback()``: finalise the output file."""
        self.unregister_callback()

    def get_output_file_path(self) -> str:
        """The output path given to ``register_callback``; RuntimeError before that."""
        if not self._registered:
            raise RuntimeError("ExecutionTraceObserver.get_output_file_path: no output file: "
                               "call register_callback(path) first")
        return self._output_file_path


def _forget_in_child(self: ExecutionTraceObserver) -> None:
    """After a fork, in the child: the registration and its file are the parent's.

    The native side stops recording by itself (et_observer.cpp); here the
    observer lets go of the parent's unfinished file without writing, removing
    or replacing it (the atomic writer leaves a file begun by another process
    alone).
    """
    self._registered = False
    self._execution_trace_running = False
    self._collector = self._writer = None


_registered_observers: "weakref.WeakSet[ExecutionTraceObserver]" = weakref.WeakSet()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [
        _forget_in_child(o) for o in list(_registered_observers)])


def _finish_or_abandon(writer: Any) -> None:
    try:
        writer.finish()
    except BaseException:
        writer.abandon()
        raise


def load_execution_trace(path: str) -> dict:
    """Read an execution-trace JSON file (plain or ``.gz``) back into a dict.

    >>> import gzip, json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "et.json.gz")
    >>> with gzip.open(path, "wt") as f:
    ...     json.dump({"schema": "1.1.1-chakra.0.0.4", "nodes": []}, f)
    >>> load_execution_trace(path)["schema"]
    '1.1.1-chakra.0.0.4'
    """
    import gzip
    import json

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)
