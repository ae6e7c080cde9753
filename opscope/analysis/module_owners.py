"""Which module call each event belongs to (``with_modules``): the computation.

Read the result through ``opscope.analysis.facts.event_modules``, which
computes it once per session; this module only says how.

A forward op belongs to the innermost module range around it. A backward op
belongs to the module whose forward created its autograd node: the node's
sequence number is matched with the forward op that had the same number on
the forward thread (the last such op to start, which is the one that created
the node). When the collector recorded no forward sequence numbers (the Python
collector), the number is looked up in the sequence-number intervals of the
module calls (``session.module_calls``). Module backward hooks are not used.

A user range named like a module (say ``record_function("Model")`` while a root
module of class ``Model`` runs) is taken for a module range.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> s = build_session(RawSession.empty())
    >>> module_range_mask(s).tolist(), module_owner_rows(s, module_range_mask(s)).tolist()
    ([], [])
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Tuple

import numpy as np

from opscope.analysis.ancestry import nearest_marked, nearest_marked_ancestor
from opscope.analysis.autograd_links import backward_marks, forward_candidates, forward_ops
from opscope.model.records import SCOPE_USER
from opscope.model.session import ProfileSession


def module_range_mask(session: ProfileSession) -> np.ndarray:
    """True for the events that are module ranges: user ranges named as a module."""
    table = session.table
    if not session.modules or len(table) == 0:
        return np.zeros(len(table), dtype=bool)
    ids = [table.symbols.id_of(name) for name in session.modules]
    ids = [i for i in ids if i is not None]
    return (table.scope == SCOPE_USER) & np.isin(table.name_id, ids)


def module_owner_rows(session: ProfileSession, is_module: np.ndarray) -> np.ndarray:
    """Per event, the row of the module range (one call) it belongs to; -1 for none.

    ``is_module`` is :func:`module_range_mask`. A module range belongs to itself.
    """
    table = session.table
    if not is_module.any():
        return np.full(len(table), -1, dtype=np.int64)
    owner = nearest_marked(table.parent, is_module)
    nodes, wrappers = backward_marks(table)
    node_rows = np.flatnonzero(nodes & (table.seq_nr >= 0))
    if len(node_rows) == 0:
        return owner
    node_owner = _link_nodes_by_forward_op(session, owner, node_rows)
    missing = node_owner < 0
    if missing.any():
        node_owner[missing] = _link_nodes_by_call_intervals(session, is_module,
                                                            node_rows[missing])
    region_owner = np.full(len(table), -1, dtype=np.int64)
    region_owner[node_rows] = node_owner
    # a wrapper belongs where its node does
    node_parent = table.parent[node_rows]
    wrapped = (node_parent >= 0) & wrappers[np.maximum(node_parent, 0)]
    region_owner[node_parent[wrapped]] = node_owner[wrapped]
    region = nearest_marked(table.parent, nodes | wrappers)
    inside = region >= 0
    attributed = np.zeros(len(table), dtype=bool)
    attributed[inside] = region_owner[region[inside]] >= 0
    # a module range inside the region itself (a compiled backward graph's, see
    # analysis.compiled_modules) owns what it holds
    has_owner = owner >= 0
    attributed[has_owner] &= region[owner[has_owner]] != region[has_owner]
    owner[attributed] = region_owner[region[attributed]]
    return owner


def _link_nodes_by_forward_op(session: ProfileSession, owner: np.ndarray,
                              node_rows: np.ndarray) -> np.ndarray:
    table = session.table
    # the latest op of a (thread, seq) key created the node
    fwd = forward_ops(table, node_rows, forward_candidates(table), latest=True)
    out = np.full(len(node_rows), -1, dtype=np.int64)
    out[fwd >= 0] = owner[fwd[fwd >= 0]]
    return out


def _link_nodes_by_call_intervals(session: ProfileSession, is_module: np.ndarray,
                                  node_rows: np.ndarray) -> np.ndarray:
    """Owner module rows of backward nodes from the calls' sequence-number intervals."""
    table = session.table
    out = np.full(len(node_rows), -1, dtype=np.int64)
    calls = _calls_by_row(session, is_module)
    if not calls:
        return out
    call_parent = nearest_marked_ancestor(table.parent, is_module)
    by_thread: Dict[int, List[Tuple[int, int, int]]] = defaultdict(list)
    for row, (begin, end) in calls.items():
        by_thread[int(table.rf_thread_id[row])].append((begin, -end, row))
    index = {}
    for thread, items in by_thread.items():
        items.sort()
        index[thread] = (np.array([b for b, _, _ in items]), [r for _, _, r in items])
    for k, node in enumerate(node_rows.tolist()):
        thread = int(table.fwd_thread_id[node]) or int(table.rf_thread_id[node])
        if thread not in index:
            continue
        begins, rows = index[thread]
        seq = int(table.seq_nr[node])
        pos = int(np.searchsorted(begins, seq, side="right")) - 1
        row = rows[pos] if pos >= 0 else -1
        while row >= 0:  # walk out from the latest call started before seq
            begin, end = calls.get(row, (0, -1))
            if begin <= seq < end:
                out[k] = row
                break
            row = int(call_parent[row])
    return out


def _calls_by_row(session: ProfileSession, is_module: np.ndarray) -> Dict[int, Tuple[int, int]]:
    """Module range row -> (seq_begin, seq_end); calls matched by thread, name and order."""
    table = session.table
    pending: Dict[Tuple[int, str], List] = defaultdict(list)
    for call in reversed(session.module_calls):
        pending[(call.os_tid, call.name)].append(call)
    out: Dict[int, Tuple[int, int]] = {}
    tids = table.os_tid
    for row in np.flatnonzero(is_module).tolist():
        queue = pending.get((int(tids[row]), table.name(row)))
        if queue:
            call = queue.pop()
            if call.seq_begin >= 0:
                end = call.seq_end if call.seq_end >= 0 else np.iinfo(np.int64).max
                out[row] = (call.seq_begin, int(end))
    return out
