"""Allocations attributed to ops: ``CPU Mem``/``Self CPU Mem`` and ``[memory]`` events.

Each allocation or free belongs to the innermost op open on its thread when it
happened. An op's self memory is the sum of its own records; its total adds
its descendants'. Records made outside any op become top-level ``[memory]``
events, as torch.profiler makes them, so that self memory summed over every
event equals the net bytes allocated in the window.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> s = build_session(RawSession.empty(), options={"profile_memory": True})
    >>> len(s.memory), sorted(s.event_memory)[:2]
    (0, ['cpu_memory_usage', 'device_memory_usage'])
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from opscope.model.arrays import distinct
from opscope.model.torch_names import MEMORY_EVENT
from opscope.analysis.ancestry import subtree_sum
from opscope.model.events import EventTable, sort_order
from opscope.model.records import FLAG_MEMORY, MEMORY_DTYPE, NO_INPUTS, NO_STACK

MEMORY_EVENT_NAME = MEMORY_EVENT
CPU_DEVICE_TYPE = 0


def attribute(table: EventTable, memory: np.ndarray) -> np.ndarray:
    """Index of the innermost event open on the record's thread at its time (-1: none)."""
    owner = np.full(len(memory), -1, dtype=np.int64)
    if len(memory) == 0 or len(table) == 0:
        return owner
    sync = ~table.is_async & ((table.flags & FLAG_MEMORY) == 0)
    for thread in distinct(memory["thread_index"]).tolist():
        rows = np.flatnonzero(sync & (table.thread_index == thread))
        mem = np.flatnonzero(memory["thread_index"] == thread)
        if len(rows) == 0:
            continue
        starts = table.start_ns[rows]  # rows are in (start, -end) order
        t = memory["time_ns"][mem]
        pos = np.searchsorted(starts, t, side="right") - 1
        cand = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
        # climb to the first ancestor still open at t (only the records not there yet)
        todo = np.flatnonzero((cand >= 0) & (table.end_ns[np.maximum(cand, 0)] < t))
        while len(todo):
            up = table.parent[cand[todo]]
            cand[todo] = up
            todo = todo[(up >= 0) & (table.end_ns[np.maximum(up, 0)] < t[todo])]
        owner[mem] = cand
    return owner


def event_memory(table: EventTable, memory: np.ndarray, owner: np.ndarray
                 ) -> Dict[str, np.ndarray]:
    """Per event: ``cpu_memory_usage``, ``self_cpu_memory_usage`` and the device pair."""
    n = len(table)
    out: Dict[str, np.ndarray] = {}
    has_owner = owner >= 0
    is_cpu = memory["device_type"] == CPU_DEVICE_TYPE
    for prefix, pick in (("cpu", is_cpu), ("device", ~is_cpu)):
        sel = has_owner & pick
        own = np.bincount(owner[sel], weights=memory["bytes"][sel], minlength=n)
        own = own.astype(np.int64)
        out[f"self_{prefix}_memory_usage"] = own
        out[f"{prefix}_memory_usage"] = subtree_sum(table.parent, own)
    return out


def with_memory_events(table: EventTable, memory: np.ndarray, owner: np.ndarray
                       ) -> Tuple[EventTable, np.ndarray]:
    """The table plus one top-level ``[memory]`` event per unattributed record.

    Returns the new table and the owners remapped to it, each unattributed
    record now owned by its own ``[memory]`` event.
    """
    loose = np.flatnonzero(owner < 0)
    if len(loose) == 0:
        return table, owner
    k = len(loose)
    times = memory["time_ns"][loose].astype(np.int64)
    threads = memory["thread_index"][loose]
    name_id = table.symbols.intern(MEMORY_EVENT_NAME)
    rf_tid = _rf_thread_of(table, threads)
    # the new rows' values: an array, or (dtype, value) where all are the same
    extra = {
        "name_id": (table.name_id.dtype, name_id), "start_ns": times, "end_ns": times,
        "thread_index": threads.astype(table.thread_index.dtype),
        "rf_thread_id": rf_tid.astype(table.rf_thread_id.dtype),
        "fwd_thread_id": rf_tid.astype(table.fwd_thread_id.dtype),
        "seq_nr": (np.int64, -1), "scope": (table.scope.dtype, 0),
        "flags": (table.flags.dtype, FLAG_MEMORY),
        "input_offset": (table.input_offset.dtype, NO_INPUTS),
        "stack_id": (np.int64, NO_STACK), "record": (np.int64, -1),
    }
    n = len(table)
    place_table, place_extra = _merged_places(table, times)
    if place_table is None:  # the table is not in (start, -end) order: sort both
        cols = {c: np.concatenate([getattr(table, c), _values(extra[c], k)])
                for c in EventTable.COLUMNS}
        order = sort_order(cols["start_ns"], cols["end_ns"])
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        place_table, place_extra = place[:n], place[n:]
    columns = {}
    for c in EventTable.COLUMNS:  # each row written once where it goes
        values, added = getattr(table, c), extra[c]
        same = type(added) is tuple
        out_col = np.empty(n + k, dtype=np.result_type(values, added[0] if same else added))
        out_col[place_table], out_col[place_extra] = values, added[1] if same else added
        columns[c] = out_col
    out = EventTable(table.symbols, columns, raw=table.raw, base_ns=table.base_ns,
                     epoch_offset_ns=table.epoch_offset_ns, thread_ids=list(table.thread_ids))
    out.parent = np.full(n + k, -1, dtype=np.int64)
    out.parent[place_table] = np.where(table.parent >= 0,
                                       place_table[np.maximum(table.parent, 0)], -1)
    out.self_ns = np.zeros(n + k, dtype=table.self_ns.dtype)
    out.self_ns[place_table] = table.self_ns
    new_owner = np.where(owner >= 0, place_table[np.maximum(owner, 0)], -1)
    new_owner[loose] = place_extra
    return out, new_owner


def _values(added, k: int) -> np.ndarray:
    """An added column of ``with_memory_events`` as an array of ``k`` values."""
    return np.full(k, added[1], dtype=added[0]) if type(added) is tuple else added


def _merged_places(table: EventTable, times: np.ndarray):
    """Where the table's rows and the zero-length ``[memory]`` events at ``times`` (in
    time order) go in (start, -end) order, the table's first at equal keys, as a stable
    sort of both would put them: (table places, memory places), or (None, None) when
    the table is not in that order already.

    >>> from opscope.model.records import RawSession, records_from_rows
    >>> def ev(s, e): return (s, e, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0)
    >>> t = EventTable.from_raw(RawSession(records_from_rows([ev(0, 9), ev(5, 6)]), [], [1],
    ...                                    ["op"], 0, 9, 0))
    >>> [p.tolist() for p in _merged_places(t, np.array([0, 5, 7]))]
    [[0, 2], [1, 3, 4]]
    """
    start, end = table.start_ns, table.end_ns
    step, shrink = np.diff(start), np.diff(end)
    if not bool(((step > 0) | ((step == 0) & (shrink <= 0))).all()) or \
            not bool((times[1:] >= times[:-1]).all()):
        return None, None
    # a [memory] event at t follows every row starting at or before t
    place_extra = np.searchsorted(start, times, side="right") + np.arange(len(times))
    taken = np.zeros(len(start) + len(times), dtype=bool)
    taken[place_extra] = True
    return np.flatnonzero(~taken), place_extra


def _rf_thread_of(table: EventTable, thread_index: np.ndarray) -> np.ndarray:
    """RecordFunction thread id of a thread (from any of its events; 0 if none)."""
    out = np.zeros(len(thread_index), dtype=np.int64)
    if len(table):
        ids, first = np.unique(table.thread_index, return_index=True)
        pos = np.clip(np.searchsorted(ids, thread_index), 0, len(ids) - 1)
        hit = ids[pos] == thread_index
        out[hit] = table.rf_thread_id[first[pos[hit]]]
    return out


def sorted_memory(memory: np.ndarray) -> np.ndarray:
    """Records in time order (stable, so one thread's order is kept): ``memory`` itself
    when it is in order already, as one thread's recording is."""
    if len(memory) == 0:
        return np.zeros(0, MEMORY_DTYPE)
    times = memory["time_ns"]
    if bool((times[1:] >= times[:-1]).all()):
        return memory
    return memory[np.argsort(times, kind="stable")]
