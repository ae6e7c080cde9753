"""Execution traces: torch's ``ExecutionTraceObserver`` and its JSON format.

``collect`` holds the native observer that records nodes, ``writer`` turns
them into torch's ET JSON, and ``observer`` is the API users call.

Example::

    >>> import opscope
    >>> et = opscope.ExecutionTraceObserver().register_callback("et.json")
"""

from opscope.execution_trace.observer import ExecutionTraceObserver, load_execution_trace

__all__ = ["ExecutionTraceObserver", "load_execution_trace"]
