"""key_averages: group events by name (and optionally overload name, shapes or stack).

One grouping serves a session's columns (``key_averages``, ``session_key_averages``)
and a list of event objects (``event_key_averages``, for ``EventList``). The plain
grouping is vectorised: ``np.unique`` over interned names and ``np.bincount`` sums.
Grouping by shapes, stack or overload name builds tuple keys, since those are
per-event Python values anyway. Reading a session never changes it.

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

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

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


def display_names(table: EventTable) -> Tuple[np.ndarray, List[str]]:
    """(per-event display name id, the names those ids index), leaving the table as it is.

    Step ranges share one id: the table's own ``ProfilerStep*`` if it has one, else an
    id just past the table's names, which the returned list (a copy) holds.

    >>> from opscope.model.events import SymbolTable
    >>> cols = {c: np.zeros(2, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1])
    >>> table = EventTable(SymbolTable(["ProfilerStep#1", "ProfilerStep#2"]), cols)
    >>> ids, names = display_names(table)
    >>> ids.tolist(), names[2], len(table.symbols)
    ([2, 2], 'ProfilerStep*', 2)
    """
    names = list(table.symbols.names)
    step_ids = [i for i, n in enumerate(names) if n.startswith(STEP_PREFIX)]
    remap = np.arange(len(names), dtype=np.int64)
    if step_ids:
        wildcard = table.symbols.id_of(STEP_WILDCARD)
        if wildcard is None:
            wildcard = len(names)
            names.append(STEP_WILDCARD)
        remap[step_ids] = wildcard
    ids = remap[table.name_id] if len(table) else np.zeros(0, dtype=np.int64)
    return ids, names


def filtered_mask(table: EventTable) -> np.ndarray:
    """True for events that torch.profiler would show (not utility ops)."""
    ids = [table.symbols.id_of(n) for n in FILTERED_NAMES]
    ids = [i for i in ids if i is not None]
    if not ids or len(table) == 0:
        return np.ones(len(table), dtype=bool)
    return ~np.isin(table.name_id, ids)


class Groups(NamedTuple):
    """Which group each kept event falls in; groups are numbered in order of first event."""

    of_event: np.ndarray  # group id per kept event
    first: np.ndarray  # per group: position of its first event among the kept ones
    count: int


def grouped(base_key: np.ndarray, columns: Sequence[Optional[Sequence]] = ()) -> Groups:
    """Group events by ``base_key`` (ints) and the per-event values of ``columns``
    (shape texts, stack tuples, overload names; None: not grouped by it).

    >>> g = grouped(np.array([7, 2, 7]))
    >>> g.of_event.tolist(), g.first.tolist(), g.count
    ([0, 1, 0], [0, 1], 2)
    """
    n = len(base_key)
    columns = [c for c in columns if c is not None]
    if not columns and int(base_key.min()) >= 0 and int(base_key.max()) < max(n, 1 << 16):
        return _grouped_small(base_key)
    if not columns:
        _, group = np.unique(base_key, return_inverse=True)
        group = group.reshape(-1)
    else:
        keys: Dict[tuple, int] = {}
        group = np.fromiter((keys.setdefault(k, len(keys))
                             for k in zip(base_key.tolist(), *columns)), np.int64, n)
    n_groups = int(group.max()) + 1
    first = np.full(n_groups, n, dtype=np.int64)
    np.minimum.at(first, group, np.arange(n))
    # renumber so that group g is the g-th key to appear
    rank = np.empty(n_groups, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(n_groups)
    return Groups(rank[group], np.sort(first), n_groups)


def _grouped_small(base_key: np.ndarray) -> Groups:
    """``grouped`` of small non-negative keys (name ids), in linear time: no sort of
    the events, only of the distinct keys.

    >>> g = _grouped_small(np.array([5, 2, 5, 0]))
    >>> g.of_event.tolist(), g.first.tolist(), g.count
    ([0, 1, 0, 2], [0, 1, 3], 3)
    """
    n = len(base_key)
    first = np.full(int(base_key.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, base_key, np.arange(n))
    keys = np.flatnonzero(first < n)
    order = np.argsort(first[keys], kind="stable")  # by first appearance
    rank = np.zeros(len(first), dtype=np.int64)
    rank[keys[order]] = np.arange(len(keys))
    return Groups(rank[base_key], first[keys[order]], len(keys))


def _float_sums(groups: Groups, values) -> np.ndarray:
    return np.bincount(groups.of_event, weights=np.asarray(values, dtype=np.float64),
                       minlength=groups.count)


def _int_sums(groups: Groups, values) -> List[int]:
    values = np.asarray(values)
    if values.dtype.kind not in "iub":
        return [int(v) for v in _float_sums(groups, values)]
    out = np.zeros(groups.count, dtype=np.int64)
    np.add.at(out, groups.of_event, values.astype(np.int64, copy=False))
    return out.tolist()


def key_averages(table: EventTable, *, group_by_input_shape: bool = False,
                 group_by_stack_n: int = 0, stacks: Optional[Sequence] = None,
                 memory: Optional[Dict[str, np.ndarray]] = None,
                 flops: Optional[np.ndarray] = None,
                 exclude: Optional[np.ndarray] = None,
                 group_by_overload_name: bool = False,
                 overload_names: Optional[Sequence[str]] = None,
                 device_ns: Optional[Tuple[np.ndarray, np.ndarray]] = None
                 ) -> List[FunctionEventAvg]:
    """One FunctionEventAvg per key, in order of each key's first event.

    ``memory`` may hold per-event ``cpu_memory_usage``/``self_cpu_memory_usage``
    arrays and ``flops`` a per-event array; missing ones count as zero.
    ``exclude``, a per-event bool array, leaves those events out of every row.
    ``overload_names`` (per event; None: none recorded, all "") is part of the key
    with ``group_by_overload_name``, as in torch.
    """
    rows_in = np.arange(len(table), dtype=np.int64)
    if exclude is not None and len(exclude) == len(table):
        rows_in = rows_in[~np.asarray(exclude, dtype=bool)]
    if len(rows_in) == 0:
        return []
    every = len(rows_in) == len(table)

    def pick(column: np.ndarray) -> np.ndarray:  # no copy of a 10M-event column for all rows
        return column if every else column[rows_in]

    ids, symbols = display_names(table)
    names = pick(ids)
    is_user = pick(table.scope) == SCOPE_USER
    overloads = None
    if group_by_overload_name:
        overloads = ([""] * len(rows_in) if overload_names is None
                     else [overload_names[i] or "" for i in rows_in.tolist()])
    groups = grouped(names.astype(np.int64) * 2 + is_user, [
        overloads if overload_names is not None else None,
        _shape_texts(table, rows_in) if group_by_input_shape else None,
        _stack_keys(stacks, rows_in, group_by_stack_n) if group_by_stack_n > 0 else None])
    mem = memory or {}
    zeros = [0] * groups.count
    total = _float_sums(groups, pick(table.duration_ns) / 1000.0)
    self_total = _float_sums(groups, pick(table.self_ns) / 1000.0)
    counts = np.bincount(groups.of_event, minlength=groups.count).tolist()
    cpu_mem, self_mem, flop_sum = (
        _int_sums(groups, np.asarray(values)[rows_in]) if values is not None else zeros
        for values in (mem.get("cpu_memory_usage"), mem.get("self_cpu_memory_usage"), flops))
    rows: List[FunctionEventAvg] = []
    for g, k in enumerate(groups.first.tolist()):
        i = int(rows_in[k])
        shapes = None
        if group_by_input_shape:
            sig, decoded = table.input_signatures()
            shapes = decoded[sig[i]].shapes if sig[i] >= 0 else []
        stack: list = []
        if group_by_stack_n > 0 and stacks is not None and stacks[i]:
            stack = list(stacks[i][:group_by_stack_n])
        rows.append(FunctionEventAvg(
            symbols[int(names[k])], count=counts[g], cpu_time_total=float(total[g]),
            self_cpu_time_total=float(self_total[g]),
            input_shapes=shapes if group_by_input_shape else "", stack=stack,
            scope=int(table.scope[i]), cpu_memory_usage=cpu_mem[g],
            self_cpu_memory_usage=self_mem[g], flops=flop_sum[g],
            is_async=bool(table.is_async[i]), is_user_annotation=bool(is_user[k]),
            overload_name=overloads[k] if overloads is not None else ""))
    if device_ns is not None:
        own = _float_sums(groups, (device_ns[0] / 1000.0)[rows_in])
        sub = _float_sums(groups, (device_ns[1] / 1000.0)[rows_in])
        for g, row in enumerate(rows):
            row.set_device_time(float(own[g]), float(sub[g]))
    return rows


def _shape_texts(table: EventTable, rows: np.ndarray) -> List[str]:
    sig, decoded = table.input_signatures()
    text = [str(rec.shapes) for rec in decoded] + ["[]"]
    return [text[k] for k in sig[rows].tolist()]  # -1 picks "[]"


def _stack_keys(stacks: Optional[Sequence], rows: np.ndarray, n: int) -> List[tuple]:
    if stacks is None:
        return [()] * len(rows)
    return [tuple((stacks[i] or [])[:n]) for i in rows.tolist()]


def session_key_averages(session, *, group_by_input_shape: bool = False,
                         group_by_stack_n: int = 0, group_by_overload_name: bool = False,
                         include_python_functions: bool = True) -> List[FunctionEventAvg]:
    """``key_averages`` of a ProfileSession, with its stacks, memory and FLOPs.

    ``include_python_functions=False`` leaves out the rows a loaded trace marks
    as ``python_function`` events (``session.python_function_rows``), as torch
    2.15's ``key_averages()`` does by default. A live opscope session has none.
    ``group_by_overload_name`` keys rows by overload name too; no source records
    overload names yet, so every row's is "" and the grouping is the plain one.

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> session_key_averages(build_session(RawSession.empty()), group_by_overload_name=True)
    []
    """
    device = getattr(session, "device", None)
    device_ns = None
    if device is not None:
        from opscope.analysis.device import device_key_averages, session_device_times

        device_ns = session_device_times(session)
    rows = key_averages(session.table, group_by_input_shape=group_by_input_shape,
                        group_by_stack_n=group_by_stack_n, stacks=session.stacks,
                        memory=session.event_memory, flops=session.flops,
                        exclude=None if include_python_functions else python_function_rows(session),
                        group_by_overload_name=group_by_overload_name, device_ns=device_ns)
    if device is not None:
        rows += device_key_averages(device, group_by_input_shape=group_by_input_shape,
                                    table_names=session.table.name)
    return rows


def python_function_rows(session) -> Optional[np.ndarray]:
    """Per table row, True where it is a ``python_function`` event; None when none are.

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> python_function_rows(build_session(RawSession.empty())) is None
    True
    """
    marks = session.python_function_rows
    return marks if marks.any() else None


def event_key_averages(events: Sequence, *, group_by_input_shape: bool = False,
                       group_by_stack_n: int = 0, group_by_overload_name: bool = False,
                       include_python_functions: bool = False) -> List[FunctionEventAvg]:
    """``key_averages`` of FunctionEvent (or FunctionEventAvg) objects, grouped as torch does.

    The key is the event's key and whether it is a user annotation, then its overload
    name, input shapes and top ``group_by_stack_n`` frames as asked. A row copies its
    first event's key, shapes, stack, scope and overload name and sums the rest.
    Events with ``is_python_function`` set are left out unless
    ``include_python_functions``.

    >>> from opscope.model.function_event import FunctionEvent
    >>> events = [FunctionEvent(id=i, name="aten::add", thread=1, start_us=i, end_us=i + 2.0,
    ...                         overload_name=o) for i, o in enumerate(["Tensor", "out", "Tensor"])]
    >>> [(r.key, r.overload_name, r.count)
    ...  for r in event_key_averages(events, group_by_overload_name=True)]
    [('aten::add', 'Tensor', 2), ('aten::add', 'out', 1)]
    """
    events = [ev for ev in events
              if include_python_functions or not getattr(ev, "is_python_function", False)]
    if not events:
        return []
    keys: Dict[tuple, int] = {}
    base_key = np.fromiter((keys.setdefault((ev.key, getattr(ev, "is_user_annotation", False)),
                                            len(keys)) for ev in events), np.int64, len(events))
    groups = grouped(base_key, [
        [getattr(ev, "overload_name", "") for ev in events] if group_by_overload_name else None,
        [str(ev.input_shapes) for ev in events] if group_by_input_shape else None,
        [tuple(ev.stack[:group_by_stack_n]) for ev in events] if group_by_stack_n > 0 else None])
    total = _float_sums(groups, [ev.cpu_time_total for ev in events])
    self_total = _float_sums(groups, [ev.self_cpu_time_total for ev in events])
    counts, cpu_mem, self_mem, flops = (_int_sums(groups, [getattr(ev, f) or 0 for ev in events])
                                        for f in ("count", "cpu_memory_usage",
                                                  "self_cpu_memory_usage", "flops"))
    rows = []
    for g, k in enumerate(groups.first.tolist()):
        ev = events[k]
        rows.append(FunctionEventAvg(
            ev.key, count=counts[g], cpu_time_total=float(total[g]),
            self_cpu_time_total=float(self_total[g]),
            input_shapes=ev.input_shapes if group_by_input_shape else "",
            stack=list(ev.stack[:group_by_stack_n]) if group_by_stack_n > 0 else [],
            scope=ev.scope, cpu_memory_usage=cpu_mem[g], self_cpu_memory_usage=self_mem[g],
            flops=flops[g], is_user_annotation=getattr(ev, "is_user_annotation", False),
            overload_name=getattr(ev, "overload_name", "") if group_by_overload_name else "",
            node_id=getattr(ev, "node_id", -1)))
    if any(ev.device_time_total for ev in events):  # a device collector's events
        own = _float_sums(groups, [ev.self_device_time_total for ev in events])
        sub = _float_sums(groups, [ev.device_time_total for ev in events])
        for g, k in enumerate(groups.first.tolist()):
            rows[g].set_device_time(float(own[g]), float(sub[g]),
                                    device_type=events[k].device_type)
    return rows


def total_average(rows: Sequence) -> FunctionEventAvg:
    """Sum of all rows (or events) into one FunctionEventAvg with key "Total"."""
    total = FunctionEventAvg()
    for row in rows:
        total.add(row)
    total.key = "Total"
    return total
