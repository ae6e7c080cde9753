"""``Profiler`` and ``fx_insert_profiling``: how much of a model Dynamo captured.

Compile with ``fx_insert_profiling`` as the backend: each graph runs as
Dynamo traced it, inside a ``TORCHDYNAMO`` range. Profile a run with
``Profiler().prof`` (an ``opscope.profile``); ``results()`` counts the ops
that ran inside those ranges against all ops, and ``report()`` lists the ops
that did not, with their source lines: that is where the graph breaks are.

Example::

    >>> import torch
    >>> model = torch.compile(torch.nn.Linear(4, 2), backend=fx_insert_profiling)
    >>> x = torch.randn(3, 4)
    >>> _ = model(x)  # compile before profiling
    >>> profiler = Profiler()
    >>> with profiler.prof:
    ...     _ = model(x)
    >>> result = profiler.results()
    >>> result.captured.graphs, result.captured.operators == result.total.operators
    (1, True)
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import torch

from opscope.activity import ProfilerActivity
from opscope.dynamo.capture import (GRAPH_RANGE_NAME, CaptureMasks, UncapturedOp,
                                    capture_result, find_captured, uncaptured_ops)
from opscope.dynamo.metrics import ProfileResult
from opscope.dynamo.report import format_report, missing_lines, print_missing
from opscope.model.session import ProfileSession
from opscope.api.profiler import profile
from opscope.record_function import record_function, recording_collector

PRINT_MISSING_ENV = ("OPSCOPE_PRINT_MISSING", "TORCHDYNAMO_PRINT_MISSING")


def should_print_missing() -> bool:
    """True when ``$OPSCOPE_PRINT_MISSING`` or ``$TORCHDYNAMO_PRINT_MISSING`` is ``1``.

    >>> import os; os.environ.pop("OPSCOPE_PRINT_MISSING", None) and None
    >>> os.environ.pop("TORCHDYNAMO_PRINT_MISSING", None) and None; should_print_missing()
    False
    """
    return any(os.environ.get(name) == "1" for name in PRINT_MISSING_ENV)


class Profiler:
    """A CPU profile of compiled code; ``results()`` says how much ran in graphs.

    ``Profiler.unique_graphs`` counts the graphs ``fx_insert_profiling`` has
    compiled since the last ``results()`` call, which reports and resets it.
    ``with_stack`` (default on) records Python stacks, which ``report()`` and
    the MISSING lines use for source lines.

    >>> p = Profiler(with_stack=False)
    >>> type(p.prof).__module__
    'opscope.api.profiler'
    """

    unique_graphs: int = 0

    def __init__(self, *, with_stack: bool = True) -> None:
        self.prof = profile(activities=[ProfilerActivity.CPU], with_stack=bool(with_stack))
        self._analysed: Optional[Tuple[ProfileSession, CaptureMasks, ProfileResult]] = None

    def results(self) -> ProfileResult:
        """Captured and total ops and time of the last profiled run.

        With ``OPSCOPE_PRINT_MISSING=1`` it also prints where each
        uncaptured op was called from.
        """
        session = self.prof.session
        masks = find_captured(session.table)
        unique = Profiler.unique_graphs
        Profiler.unique_graphs = 0
        result = capture_result(session.table, masks, unique_graphs=unique)
        self._analysed = (session, masks, result)
        if should_print_missing():
            rows = masks.uncaptured.nonzero()[0].tolist()
            stacks = session.stacks
            print_missing(missing_lines([session.table.name(i) for i in rows],
                                        [stacks[i] if stacks is not None else None
                                         for i in rows]))
        return result

    def _analysis(self) -> Tuple[ProfileSession, CaptureMasks, ProfileResult]:
        session = self.prof.session
        if self._analysed is None or self._analysed[0] is not session:
            self.results()
        assert self._analysed is not None
        return self._analysed

    def uncaptured(self) -> List[UncapturedOp]:
        """Ops that ran outside every compiled graph, by op and source line, most time first."""
        session, masks, _ = self._analysis()
        return uncaptured_ops(session.table, masks, session.stacks)

    def report(self, top: int = 10) -> str:
        """A readable coverage report listing the ``top`` uncaptured ops.

        Reuses the last ``results()`` of this run (calling it if needed).
        """
        session, masks, result = self._analysis()
        ops = uncaptured_ops(session.table, masks, session.stacks)
        stacks_recorded = session.stacks is not None and any(session.stacks)
        return format_report(result, ops, top=top, stacks_recorded=stacks_recorded,
                             stacks_requested=bool(session.options.get("with_stack")))

    def summary(self) -> str:
        """One line, as torch prints it: ``N graphs M graph calls c/t = NN% ops NN% time``."""
        return str(self._analysis()[2])


def fx_insert_profiling(gm: torch.fx.GraphModule, example_inputs: List[Any]) -> Any:
    """A ``torch.compile`` backend: run each graph as traced, inside a ``TORCHDYNAMO`` range.

    The range goes to the running opscope profiler, else to a running
    torch.profiler; with neither, the graph just runs.

    >>> import torch
    >>> f = torch.compile(lambda x: x * 2, backend=fx_insert_profiling)
    >>> f(torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    if not callable(getattr(gm, "forward", None)):
        raise TypeError("fx_insert_profiling: gm must be a torch.fx.GraphModule (something "
                        f"with a forward method), got {type(gm).__name__}")

    def _wrapped(*args: Any) -> Any:
        if recording_collector() is not None:
            with record_function(GRAPH_RANGE_NAME):
                return gm.forward(*args)
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function(GRAPH_RANGE_NAME):
                return gm.forward(*args)
        return gm.forward(*args)

    Profiler.unique_graphs += 1
    return _wrapped
