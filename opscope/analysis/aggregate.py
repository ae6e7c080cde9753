"""key_averages: group events by name (and optionally shapes or stack), columnar.

The plain grouping is vectorised: ``np.unique`` over interned names and
``np.bincount`` sums. Grouping by shapes or stack builds string keys, since
those are per-event Python values anyway.

Example::

    >>> import numpy as np
    >>> from opscope.model.events import EventTable, SymbolTable
    >>> cols = {c: np.zeros(3, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1, 1]); cols["start_ns"] = np.array([0, 10, 30])
    >>> cols["end_ns"] = np.array([100, 20, 50])
    >>> rows = key_averages(EventTable(SymbolTable(["step", "aten::add"]), cols))
    >>> [(r.key, r.count, r.cpu_time_total) for r in rows]
    [('step', 1, 0.1), ('aten::add', 2, 0.03)]
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from opscope.model.torch_names import PROFILER_STEP_PREFIX, PROFILER_STEP_WILDCARD
from opscope.model.events import EventTable
from opscope.model.function_event import FunctionEventAvg
from opscope.model.records import SCOPE_USER

# Utility ops torch.profiler leaves out of events() and key_averages().
FILTERED_NAMES = (
    "[memory]",
    "[OutOfMemory]",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "aten::is_leaf",
    "aten::output_nr",
    "aten::_version",
)
STEP_PREFIX = PROFILER_STEP_PREFIX
STEP_WILDCARD = PROFILER_STEP_WILDCARD


def display_name(name: str) -> str:
    """The name torch shows in tables: ``ProfilerStep#3`` becomes ``ProfilerStep*``."""
    return STEP_WILDCARD if name.startswith(STEP_PREFIX) else name


def display_name_ids(table: EventTable) -> np.ndarray:
    """Per-event id of the display name (step ranges share one id)."""
    step_ids = [i for i, n in enumerate(table.symbols.names) if n.startswith(STEP_PREFIX)]
    wildcard = table.symbols.intern(STEP_WILDCARD) if step_ids else -1
    remap = np.arange(len(table.symbols), dtype=np.int64)
    remap[step_ids] = wildcard
    return remap[table.name_id] if len(table) else np.zeros(0, dtype=np.int64)


def filtered_mask(table: EventTable) -> np.ndarray:
    """True for events that torch.profiler would show (not utility ops)."""
    ids = [table.symbols.id_of(n) for n in FILTERED_NAMES]
    ids = [i for i in ids if i is not None]
    if not ids or len(table) == 0:
        return np.ones(len(table), dtype=bool)
    return ~np.isin(table.name_id, ids)


def key_averages(table: EventTable, *, group_by_input_shape: bool = False,
                 group_by_stack_n: int = 0, stacks: Optional[Sequence] = None,
                 memory: Optional[Dict[str, np.ndarray]] = None,
                 flops: Optional[np.ndarray] = None,
                 exclude: Optional[np.ndarray] = None) -> List[FunctionEventAvg]:
    """One FunctionEventAvg per key, in order of each key's first event.

    ``memory`` may hold per-event ``cpu_memory_usage``/``self_cpu_memory_usage``
    arrays and ``flops`` a per-event array; missing ones count as zero.
    ``exclude``, a per-event bool array, leaves those events out of every row.
    """
    rows_in = np.arange(len(table), dtype=np.int64)
    if exclude is not None and len(exclude) == len(table):
        rows_in = rows_in[~np.asarray(exclude, dtype=bool)]
    n = len(rows_in)
    if n == 0:
        return []
    names = display_name_ids(table)[rows_in]
    is_user = (table.scope[rows_in] == SCOPE_USER).astype(np.int64)
    base_key = names * 2 + is_user
    if group_by_input_shape or group_by_stack_n > 0:
        group = _string_groups(table, rows_in, base_key, group_by_input_shape,
                               group_by_stack_n, stacks)
    else:
        _, group = np.unique(base_key, return_inverse=True)
    n_groups = int(group.max()) + 1
    first = np.full(n_groups, n, dtype=np.int64)
    np.minimum.at(first, group, np.arange(n))
    order = np.argsort(first, kind="stable")

    def summed(per_event: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=np.asarray(per_event)[rows_in], minlength=n_groups)

    counts = np.bincount(group, minlength=n_groups)
    total = summed(table.duration_ns / 1000.0)
    self_total = summed(table.self_ns / 1000.0)
    zeros = np.zeros(n_groups)
    mem = memory or {}
    cpu_mem = summed(mem["cpu_memory_usage"]) if "cpu_memory_usage" in mem else zeros
    self_mem = summed(mem["self_cpu_memory_usage"]) if "self_cpu_memory_usage" in mem else zeros
    flop_sum = summed(flops) if flops is not None else zeros

    symbols = table.symbols
    rows: List[FunctionEventAvg] = []
    for g in order.tolist():
        k = int(first[g])
        i = int(rows_in[k])
        shapes = None
        if group_by_input_shape:
            sig, decoded = table.input_signatures()
            shapes = decoded[sig[i]].shapes if sig[i] >= 0 else []
        stack: list = []
        if group_by_stack_n > 0 and stacks is not None and stacks[i]:
            stack = list(stacks[i][:group_by_stack_n])
        rows.append(FunctionEventAvg(
            symbols[int(names[k])],
            count=int(counts[g]),
            cpu_time_total=float(total[g]),
            self_cpu_time_total=float(self_total[g]),
            input_shapes=shapes if group_by_input_shape else "",
            stack=stack,
            scope=int(table.scope[i]),
            cpu_memory_usage=int(cpu_mem[g]),
            self_cpu_memory_usage=int(self_mem[g]),
            flops=int(flop_sum[g]),
            is_async=bool(table.is_async[i]),
            is_user_annotation=bool(is_user[k]),
        ))
    return rows


def session_key_averages(session, *, group_by_input_shape: bool = False,
                         group_by_stack_n: int = 0,
                         include_python_functions: bool = True) -> List[FunctionEventAvg]:
    """``key_averages`` of a ProfileSession, with its stacks, memory and FLOPs.

    ``include_python_functions=False`` leaves out the rows a loaded trace marks
    as ``python_function`` events (``session.python_function_rows``), as torch
    2.15's ``key_averages()`` does by default. A live opscope session has none.

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> session_key_averages(build_session(RawSession.empty()))
    []
    """
    return key_averages(session.table, group_by_input_shape=group_by_input_shape,
                        group_by_stack_n=group_by_stack_n, stacks=session.stacks,
                        memory=session.event_memory, flops=session.flops,
                        exclude=None if include_python_functions else python_function_rows(session))


def python_function_rows(session) -> Optional[np.ndarray]:
    """Per table row, True where it is a ``python_function`` event; None when none are.

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> python_function_rows(build_session(RawSession.empty())) is None
    True
    """
    marks = getattr(session, "python_function_rows", None)
    return None if marks is None else np.asarray(marks, dtype=bool)


def _string_groups(table: EventTable, rows_in: np.ndarray, base_key: np.ndarray,
                   by_shape: bool, stack_n: int, stacks: Optional[Sequence]) -> np.ndarray:
    """Group ids of the events ``rows_in`` (``base_key`` is already theirs)."""
    keys: Dict[tuple, int] = {}
    out = np.empty(len(rows_in), dtype=np.int64)
    base = base_key.tolist()
    if by_shape:
        sig, decoded = table.input_signatures()
        shape_text = [str(rec.shapes) for rec in decoded] + ["[]"]
        shape_of = [shape_text[k] for k in sig.tolist()]  # -1 picks "[]"
    for k, i in enumerate(rows_in.tolist()):
        parts: tuple = (base[k],)
        if by_shape:
            parts += (shape_of[i],)
        if stack_n > 0:
            frames = stacks[i] if stacks is not None and stacks[i] else []
            parts += tuple(frames[:stack_n])
        out[k] = keys.setdefault(parts, len(keys))
    return out


def total_average(rows: Sequence) -> FunctionEventAvg:
    """Sum of all rows (or events) into one FunctionEventAvg with key "Total"."""
    total = FunctionEventAvg()
    for row in rows:
        total.add(row)
    total.key = "Total"
    return total
