"""Execution traces: torch's ``ExecutionTraceObserver`` and its JSON format.

``collect`` holds the native observer that records nodes, ``writer`` turns
them into torch's ET JSON, and ``observer`` is the API users call.

Example::

    >>> import os, tempfile, torch, opscope
    >>> path = os.path.join(tempfile.mkdtemp(), "et.json")
    >>> et = opscope.ExecutionTraceObserver().register_callback(path)
    >>> et.start(); _ = torch.ones(2) + 1; et.stop()
    >>> et.unregister_callback()      # writes the file
    >>> "aten::add" in [node["name"] for node in load_execution_trace(path)["nodes"]]
    True
"""

from opscope.execution_trace.observer import ExecutionTraceObserver, load_execution_trace

__all__ = ["ExecutionTraceObserver", "load_execution_trace"]
