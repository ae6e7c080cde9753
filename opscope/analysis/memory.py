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
    for thread in np.unique(memory["thread_index"]).tolist():
        rows = np.flatnonzero(sync & (table.thread_index == thread))
        mem = np.flatnonzero(memory["thread_index"] == thread)
        if len(rows) == 0:
            continue
        starts = table.start_ns[rows]  # rows are in (start, -end) order
        t = memory["time_ns"][mem]
        pos = np.searchsorted(starts, t, side="right") - 1
        cand = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
        # climb to the first ancestor still open at t
        open_at = (cand >= 0) & (table.end_ns[np.maximum(cand, 0)] >= t)
        while True:
            climb = (cand >= 0) & ~open_at
            if not climb.any():
                break
            cand[climb] = table.parent[cand[climb]]
            open_at = (cand >= 0) & (table.end_ns[np.maximum(cand, 0)] >= t)
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
    rec = memory[loose]
    name_id = table.symbols.intern(MEMORY_EVENT_NAME)
    rf_tid = _rf_thread_of(table, rec["thread_index"])
    extra = {
        "name_id": np.full(k, name_id, dtype=table.name_id.dtype),
        "start_ns": rec["time_ns"].astype(np.int64),
        "end_ns": rec["time_ns"].astype(np.int64),
        "thread_index": rec["thread_index"].astype(table.thread_index.dtype),
        "rf_thread_id": rf_tid.astype(table.rf_thread_id.dtype),
        "fwd_thread_id": rf_tid.astype(table.fwd_thread_id.dtype),
        "seq_nr": np.full(k, -1, dtype=np.int64),
        "scope": np.zeros(k, dtype=table.scope.dtype),
        "flags": np.full(k, FLAG_MEMORY, dtype=table.flags.dtype),
        "input_offset": np.full(k, NO_INPUTS, dtype=table.input_offset.dtype),
        "stack_id": np.full(k, NO_STACK, dtype=np.int64),
        "record": np.full(k, -1, dtype=np.int64),
    }
    cols = {c: np.concatenate([getattr(table, c), extra[c]]) for c in EventTable.COLUMNS}
    order = sort_order(cols["start_ns"], cols["end_ns"])
    out = EventTable(table.symbols, {c: v[order] for c, v in cols.items()}, raw=table.raw,
                     base_ns=table.base_ns, epoch_offset_ns=table.epoch_offset_ns,
                     thread_ids=list(table.thread_ids))
    remap = np.empty(len(order), dtype=np.int64)
    remap[order] = np.arange(len(order))
    parent = np.concatenate([table.parent, np.full(k, -1, dtype=np.int64)])
    out.parent = np.where(parent[order] >= 0, remap[np.maximum(parent[order], 0)], -1)
    out.self_ns = np.concatenate([table.self_ns, np.zeros(k, dtype=table.self_ns.dtype)])[order]
    new_owner = np.where(owner >= 0, remap[np.maximum(owner, 0)], -1)
    new_owner[loose] = remap[len(table) + np.arange(k)]
    return out, new_owner


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
    """Records in time order (stable, so one thread's order is kept)."""
    if len(memory) == 0:
        return np.zeros(0, MEMORY_DTYPE)
    return memory[np.argsort(memory["time_ns"], kind="stable")]
