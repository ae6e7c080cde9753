"""``opscope.dynamo``: how much of a ``torch.compile``'d model runs in compiled graphs.

The API of ``torch._dynamo.profiler``, on opscope's collector: compile with
``fx_insert_profiling`` as the backend, profile with ``Profiler().prof``,
then read ``results()`` (captured vs total ops and time) or ``report()``
(the same, plus the uncaptured ops and their source lines: the graph breaks).
``OPSCOPE_PRINT_MISSING=1`` (or ``TORCHDYNAMO_PRINT_MISSING=1``) makes
``results()`` print the Python stack of each uncaptured op.

Example::

    >>> import torch
    >>> from opscope.dynamo import Profiler, fx_insert_profiling
    >>> model = torch.compile(torch.nn.Linear(4, 2), backend=fx_insert_profiling)
    >>> x = torch.randn(3, 4); _ = model(x)
    >>> profiler = Profiler()
    >>> with profiler.prof:
    ...     _ = model(x)
    >>> str(profiler.results().percent())
    '100% ops 100% time'
"""

from __future__ import annotations

from opscope.dynamo.capture import (GRAPH_RANGE_NAME, CaptureMasks, UncapturedOp,
                                    capture_result, find_captured, operator_mask,
                                    uncaptured_ops)
from opscope.dynamo.metrics import ProfileMetrics, ProfileResult
from opscope.dynamo.profiler import Profiler, fx_insert_profiling, should_print_missing
from opscope.dynamo.report import format_report, missing_line, print_missing

__all__ = [
    "ProfileMetrics",
    "ProfileResult",
    "Profiler",
    "fx_insert_profiling",
    "should_print_missing",
    "print_missing",
    "missing_line",
    "format_report",
    "find_captured",
    "capture_result",
    "uncaptured_ops",
    "operator_mask",
    "CaptureMasks",
    "UncapturedOp",
    "GRAPH_RANGE_NAME",
]
