"""Python stacks per event, with backward ops linked to their forward op.

The collector gives each op the Python stack of the thread that ran it. A
backward node (``AddmmBackward0``) runs from ``loss.backward()``, which says
nothing about the model code, so it takes the stack of the forward op that
created it (same sequence number, the forward op's thread), and every op it
runs inherits that stack.

Example::

    >>> import numpy as np
    >>> inherit_down(np.array([-1, 0, 1]), np.array([7, -1, -1]), np.array([False, True, True]))
    array([7, 7, 7])
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from opscope.model.events import EventTable
from opscope.model.records import NO_STACK, SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION


def inherit_down(parent: np.ndarray, values: np.ndarray, take: np.ndarray) -> np.ndarray:
    """``values`` where events marked ``take`` copy their parent's value, top-down."""
    out = values.copy()
    rows = np.flatnonzero(take & (parent >= 0))
    while len(rows):
        new = out[parent[rows]]
        changed = new != out[rows]
        if not changed.any():
            break
        out[rows] = new
    return out


def backward_stack_ids(table: EventTable) -> np.ndarray:
    """Stack id per event, with backward nodes and their ops given the forward stack."""
    sid = table.stack_id.copy()
    scope = table.scope
    seq = table.seq_nr
    is_bwd = (scope == SCOPE_BACKWARD_FUNCTION) & (seq >= 0)
    if not is_bwd.any():
        return sid
    fwd = np.flatnonzero((scope == SCOPE_FUNCTION) & (seq >= 0) & (sid != NO_STACK))
    # first forward op per (thread, seq): keys as one int64
    fwd_key = (table.rf_thread_id[fwd].astype(np.int64) << 40) | seq[fwd]
    keys, first = np.unique(fwd_key, return_index=True)
    bwd = np.flatnonzero(is_bwd)
    bwd_key = (table.fwd_thread_id[bwd].astype(np.int64) << 40) | seq[bwd]
    pos = np.clip(np.searchsorted(keys, bwd_key), 0, max(len(keys) - 1, 0))
    hit = (len(keys) > 0) & (keys[pos] == bwd_key) if len(keys) else np.zeros(len(bwd), bool)
    sid[bwd[hit]] = sid[fwd[first[pos[hit]]]]
    # ops under a backward node (not themselves nodes) take the node's stack
    under = inherit_down(table.parent, is_bwd.astype(np.int8), ~is_bwd).astype(bool)
    return inherit_down(table.parent, sid, under & ~is_bwd)


def event_stacks(table: EventTable, stack_table: Optional[List[List[str]]]
                 ) -> Optional[List[Optional[List[str]]]]:
    """Frames (innermost first) per event, or None when no stacks were recorded."""
    if stack_table is None:
        return None
    sid = backward_stack_ids(table).tolist()
    return [stack_table[s] if s >= 0 else None for s in sid]
