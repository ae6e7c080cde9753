"""Which ops ran inside a compiled graph: the Dynamo coverage analysis.

``fx_insert_profiling`` wraps every graph Dynamo compiles in a
``TORCHDYNAMO`` range. Over a recorded :class:`EventTable`:

- an *operator* is an event named ``namespace::name`` (``aten::mm``,
  ``autograd::engine::evaluate_function: ...``) that is not a user range;
  Dynamo's own bookkeeping ranges (``Torch-Compiled Region: 0/0``,
  ``TorchDynamo Cache Lookup``) and ``ProfilerStep#N`` are not operators;
- a *top-level* operator has no operator among its ancestors (ops called
  from inside other ops are not counted again);
- a top-level operator is *captured* when a ``TORCHDYNAMO`` range is among
  its ancestors.

Ancestry follows ``table.parent``, one level per vectorised pass.

Example::

    >>> import numpy as np
    >>> from opscope.model.events import EventTable, SymbolTable
    >>> cols = {c: np.zeros(3, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1, 1]); cols["scope"] = np.array([7, 0, 0])
    >>> t = EventTable(SymbolTable(["TORCHDYNAMO", "aten::mul"]), cols)
    >>> t.parent = np.array([-1, 0, -1])
    >>> find_captured(t).captured.tolist()
    [False, True, False]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np

from opscope.dynamo.metrics import ProfileMetrics, ProfileResult
from opscope.dynamo.stack_frames import user_frames
from opscope.model.events import EventTable
from opscope.model.records import SCOPE_USER

GRAPH_RANGE_NAME = "TORCHDYNAMO"


@dataclass
class CaptureMasks:
    """Per-event boolean columns of one table (same length and order).

    ``graph_calls``: the ``TORCHDYNAMO`` ranges; ``top_level``: operators with
    no operator above them; ``captured``: top-level operators inside a graph.
    """

    graph_calls: np.ndarray
    top_level: np.ndarray
    captured: np.ndarray

    @property
    def uncaptured(self) -> np.ndarray:
        """Top-level operators that ran outside every compiled graph."""
        return self.top_level & ~self.captured


def operator_mask(table: EventTable) -> np.ndarray:
    """True for events that are operators (``ns::name``, not a user range).

    >>> from opscope.model.events import SymbolTable
    >>> cols = {c: np.zeros(2, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1])
    >>> operator_mask(EventTable(SymbolTable(["Torch-Compiled Region: 0/0", "aten::t"]),
    ...                          cols)).tolist()
    [False, True]
    """
    if len(table) == 0:
        return np.zeros(0, dtype=bool)
    namespaced = np.fromiter(("::" in name for name in table.symbols.names), dtype=bool,
                             count=len(table.symbols))
    return namespaced[table.name_id] & (table.scope != SCOPE_USER)


def find_captured(table: EventTable) -> CaptureMasks:
    """Classify every event of ``table`` (whose ``parent`` column is filled)."""
    n = len(table)
    graph_id = table.symbols.id_of(GRAPH_RANGE_NAME)
    is_graph = (table.name_id == graph_id) if graph_id is not None else np.zeros(n, dtype=bool)
    is_op = operator_mask(table) & ~is_graph
    under_op = np.zeros(n, dtype=bool)
    under_graph = np.zeros(n, dtype=bool)
    parent = table.parent
    rows = np.flatnonzero(parent >= 0)
    ancestor = parent[rows]
    while len(rows):  # one pass per tree level, only over events with an ancestor left
        under_op[rows] |= is_op[ancestor]
        under_graph[rows] |= is_graph[ancestor]
        ancestor = parent[ancestor]
        more = ancestor >= 0
        rows, ancestor = rows[more], ancestor[more]
    top_level = is_op & ~under_op
    return CaptureMasks(graph_calls=is_graph, top_level=top_level,
                        captured=top_level & under_graph)


def capture_result(table: EventTable, masks: CaptureMasks, unique_graphs: int = 0) -> ProfileResult:
    """The ``ProfileResult`` of a classified table.

    Fusions are counted as torch's Dynamo profiler counts them: captured ops
    minus graph calls, and total ops minus one.
    """
    duration_us = table.duration_ns / 1000.0
    calls = int(masks.graph_calls.sum())
    captured_ops = int(masks.captured.sum())
    total_ops = int(masks.top_level.sum())
    captured = ProfileMetrics(microseconds=float(duration_us[masks.captured].sum()),
                              operators=captured_ops, fusions=captured_ops - calls,
                              graphs=calls)
    total = ProfileMetrics(microseconds=float(duration_us[masks.top_level].sum()),
                           operators=total_ops, fusions=total_ops - 1, graphs=calls)
    return ProfileResult(captured=captured, total=total, unique_graphs=unique_graphs)


@dataclass
class UncapturedOp:
    """Uncaptured calls of one op from one source line, summed.

    ``source`` is the innermost user frame (``file.py(12): forward``), or ""
    when no Python stack was recorded; ``stack`` holds that call's user
    frames, innermost first.
    """

    name: str
    source: str
    calls: int = 0
    microseconds: float = 0.0
    stack: List[str] = field(default_factory=list)


def uncaptured_ops(table: EventTable, masks: CaptureMasks, stacks=None) -> List[UncapturedOp]:
    """Uncaptured top-level ops grouped by (name, source line), most time first.

    ``stacks`` is the session's per-event stack list (innermost first) or None.
    """
    groups = {}
    rows = np.flatnonzero(masks.uncaptured)
    durations = (table.duration_ns[rows] / 1000.0).tolist()
    for i, us in zip(rows.tolist(), durations):
        frames = user_frames(stacks[i]) if stacks is not None and stacks[i] else []
        key = (table.name(i), frames[0] if frames else "")
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = UncapturedOp(name=key[0], source=key[1], stack=frames)
        entry.calls += 1
        entry.microseconds += us
    return sorted(groups.values(), key=lambda e: (-e.microseconds, -e.calls, e.name, e.source))
