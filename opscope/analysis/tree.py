"""Parent/child nesting and self time, by torch.profiler's rules.

Per thread, events sorted by (start, -end) nest with a stack: an event is a
child of the innermost open event that fully contains it. Async events take
no part. Then, as torch does, a child that has its parent's name and is that
parent's only child is folded into the parent (``aten::foo`` inside
``aten::foo``). Self time is duration minus the children's durations.

Example::

    >>> import numpy as np
    >>> from opscope.model.events import EventTable, SymbolTable
    >>> cols = {c: np.zeros(2, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1]); cols["start_ns"] = np.array([0, 10])
    >>> cols["end_ns"] = np.array([100, 20])
    >>> t = build_tree(EventTable(SymbolTable(["outer", "inner"]), cols))
    >>> t.parent.tolist(), t.self_ns.tolist()
    ([-1, 0], [90, 10])
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional, Tuple

import numpy as np

from opscope.model.events import EventTable
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION
from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX


def assign_parents(table: EventTable) -> np.ndarray:
    """Parent index of each event (-1 for a root), from interval nesting.

    Vectorised, one thread at a time: a depth sweep finds each event's
    innermost open interval. A thread whose intervals are not cleanly nested
    (two ranges that cross) is redone with the exact stack rule, so the
    result always equals torch's.
    """
    is_async = table.is_async
    sync = np.flatnonzero(~is_async) if is_async.any() else None
    thread, start, end = table.thread_index, table.start_ns, table.end_ns
    if sync is not None:
        thread, start, end = thread[sync], start[sync], end[sync]
    found: Optional[np.ndarray] = None
    for rows in _thread_rows(thread):
        s, e = (start, end) if rows is None else (start[rows], end[rows])
        local = _parents_by_depth(s, e)
        if local is None:
            local = _parents_by_stack(s, e, np.arange(len(s)))
        if rows is None:  # one thread: its positions are the rows
            found = local
            continue
        if found is None:
            found = np.full(len(start), -1, dtype=np.int64)
        found[rows] = np.where(local >= 0, rows[np.maximum(local, 0)], -1)
    if found is None:  # no events
        found = np.full(len(start), -1, dtype=np.int64)
    if sync is None:
        return found
    parent = np.full(len(table), -1, dtype=np.int64)
    parent[sync] = np.where(found >= 0, sync[np.maximum(found, 0)], -1)
    return parent


def _thread_rows(thread: np.ndarray):
    """Each thread's positions in ``thread`` (ascending), or one None when all are one thread."""
    if len(thread) == 0:
        return
    if not (thread != thread[0]).any():
        yield None
        return
    order = _stable_order(thread.astype(np.int64) - int(thread.min()))
    counts = np.bincount(thread[order] - thread.min())
    bounds = np.concatenate(([0], np.cumsum(counts[counts > 0])))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        yield order[lo:hi]


def _parents_by_depth(start: np.ndarray, end: np.ndarray) -> Optional[np.ndarray]:
    """One thread's parents (positions), or None where its intervals do not nest cleanly.

    Rows are sorted by (start, -end). An event's depth is the number of
    earlier non-zero-length events still open at its start (end after it:
    touching ranges do not nest); zero-length events never contain anything.
    The parent is the latest earlier event one level up. Each step is a
    linear pass or a search with ascending keys, so the cost stays linear.
    The answer is checked: every parent contains its child and exactly the
    events of depth 0 are roots. Then the open events at each start are its
    ancestors, which is what torch's stack holds, so the answer is torch's;
    where the check fails (crossing ranges), None.

    >>> _parents_by_depth(np.array([0, 1, 2, 5]), np.array([9, 4, 3, 6])).tolist()
    [-1, 0, 1, 0]
    """
    n = len(start)
    if n < 2:
        return np.full(n, -1, dtype=np.int64)
    if _all_roots(start, end):
        return np.full(n, -1, dtype=np.int64)
    nonzero = end > start
    depth = np.cumsum(nonzero)
    depth -= nonzero  # non-zero events before each
    ends = end[nonzero]
    if not bool((ends[1:] >= ends[:-1]).all()):
        ends.sort()
    depth -= np.searchsorted(ends, start, side="right")  # minus those closed by its start
    del ends, nonzero
    if int(depth.max()) >= 1 << 16:
        return None
    # positions grouped by depth, ascending within a level (radix sort of 16-bit keys)
    by_level = np.argsort(depth.astype(np.uint16), kind="stable")
    keys = depth[by_level] * n + by_level  # ascending
    # the latest position one level up: keys below (depth - 1) * n + position
    pos = np.searchsorted(keys, keys - n) - 1
    cand = keys[np.maximum(pos, 0)]
    low = (depth[by_level] - 1) * n
    found = np.empty(n, dtype=np.int64)
    found[by_level] = np.where((pos >= 0) & (cand >= low), cand - low, -1)
    del keys, pos, cand, low, by_level
    has = found >= 0
    if not np.array_equal(has, depth > 0):
        return None
    p = found[has]
    s, e = start[has], end[has]
    if not bool(((start[p] <= s) & (e <= end[p]) & (s < end[p])).all()):
        return None
    return found


def _all_roots(start: np.ndarray, end: np.ndarray, step: int = 1 << 20) -> bool:
    """True when no event reaches past a later one's start (nothing nests): the
    latest end so far, taken a block at a time, never exceeds the next start.

    >>> _all_roots(np.array([0, 5, 5]), np.array([5, 5, 9])), _all_roots(np.array([0, 1]), np.array([5, 2]))
    (True, False)
    """
    reach = None
    for lo in range(0, len(start), step):
        hi = min(len(start), lo + step)
        if reach is not None and reach > start[lo]:
            return False
        latest = np.maximum.accumulate(end[lo:hi])
        if reach is not None:
            np.maximum(latest, reach, out=latest)
        if not bool((latest[:-1] <= start[lo + 1:hi]).all()):
            return False
        reach = latest[-1]
    return True


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for non-negative ints, as a radix sort
    when they fit in 16 bits (numpy sorts 16-bit ints by radix: linear time).

    >>> _stable_order(np.array([2, 0, 2, 1])).tolist()
    [1, 3, 0, 2]
    """
    if len(keys) and int(keys.max()) < 1 << 16 and int(keys.min()) >= 0:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def _parents_by_stack(start: np.ndarray, end: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """torch's stack rule on one thread's events (sorted by (start, -end)).

    An open event stops being a candidate parent once an event starts at or
    after its end, or ends after it. Returns positions into the full arrays.
    """
    out = [-1] * len(rows)
    stack_pos: list = []
    stack_end: list = []
    rows_l = rows.tolist()
    for k, (s, e) in enumerate(zip(start.tolist(), end.tolist())):
        while stack_end and (s >= stack_end[-1] or e > stack_end[-1]):
            stack_end.pop()
            stack_pos.pop()
        if stack_pos:
            out[k] = stack_pos[-1]
        stack_pos.append(rows_l[k])
        stack_end.append(e)
    return np.asarray(out, dtype=np.int64)


def fold_duplicate_children(table: EventTable, parent: np.ndarray) -> np.ndarray:
    """Mask of events to keep after folding same-name only-children into parents.

    ``parent`` is updated in place so that the children of a folded event
    point at the event it was folded into.
    """
    n = len(table)
    keep = np.ones(n, dtype=bool)
    if not (parent >= 0).any():
        return keep
    names = table.name_id
    while True:
        live_parent = np.where(keep, parent, -1)
        child_count = np.bincount(live_parent[live_parent >= 0], minlength=n)
        has_parent = live_parent >= 0
        p = np.where(has_parent, live_parent, 0)
        dup = has_parent & (names[p] == names) & (child_count[p] == 1) & keep
        if not dup.any():
            return keep
        keep &= ~dup
        # re-point children of folded events at the folded event's parent
        while True:
            pp = np.where(parent >= 0, parent, 0)
            moved = (parent >= 0) & ~keep[pp]
            if not moved.any():
                break
            parent[moved] = parent[pp[moved]]


def build_tree(table: EventTable) -> EventTable:
    """Fill ``parent`` and ``self_ns``; returns a table without folded duplicates."""
    parent = assign_parents(table)
    keep = fold_duplicate_children(table, parent)
    table.parent = parent
    if not keep.all():
        table = table.take(keep)
    self_ns = table.duration_ns
    has = table.parent >= 0
    if has.any():
        self_ns -= _child_totals(table.parent[has], self_ns[has], len(table))
    table.self_ns = self_ns
    return table


def _child_totals(parent: np.ndarray, duration: np.ndarray, n: int) -> np.ndarray:
    """Per event, the summed durations of its children (exact integers).

    ``np.bincount`` sums in float64, exact while every total is below 2**53 ns
    (104 days); longer totals are summed with ``np.add.at``.

    >>> _child_totals(np.array([0, 0, 2]), np.array([3, 4, 5]), 3).tolist()
    [7, 0, 5]
    """
    if max(int(duration.max()), -int(duration.min())) * len(duration) < 1 << 53:
        return np.bincount(parent, weights=duration, minlength=n).astype(np.int64)
    total = np.zeros(n, dtype=np.int64)
    np.add.at(total, parent, duration)
    return total


def infer_backward_nodes(table: EventTable) -> None:
    """Give autograd nodes without a sequence number their backward scope.

    A saved trace marks a backward node only by its ``Fwd thread id``, written
    only with a sequence number; a node without one (``AccumulateGrad``) is
    recognised as a child named like its
    ``autograd::engine::evaluate_function: <node>`` parent. A collector
    records the scope itself, so this changes nothing in a live session.

    >>> import numpy as np
    >>> from opscope.model.events import SymbolTable
    >>> from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX as P
    >>> cols = {c: np.zeros(2, dtype=np.int64) for c in EventTable.COLUMNS}
    >>> cols["name_id"] = np.array([0, 1]); cols["end_ns"] = np.array([9, 5])
    >>> t = build_tree(EventTable(SymbolTable([P + "AccumulateGrad", "AccumulateGrad"]), cols))
    >>> infer_backward_nodes(t); t.scope.tolist()  # 1: SCOPE_BACKWARD_FUNCTION
    [0, 1]
    """
    if len(table) == 0:
        return
    names = table.symbols.names
    wrapper_of = np.full(len(names), -1, dtype=np.int64)
    for node_id, name in enumerate(names):
        wrapper = table.symbols.id_of(EVALUATE_FUNCTION_PREFIX + name)
        if wrapper is not None:
            wrapper_of[node_id] = wrapper
    rows = np.flatnonzero((table.parent >= 0) & (table.scope == SCOPE_FUNCTION))
    expected = wrapper_of[table.name_id[rows]]
    match = (expected >= 0) & (table.name_id[table.parent[rows]] == expected)
    table.scope[rows[match]] = SCOPE_BACKWARD_FUNCTION


def without_rows(table: EventTable, drop: np.ndarray,
                 per_row: Dict[str, Any]) -> Tuple[EventTable, Dict[str, Any]]:
    """The table without the rows ``drop``, everyone's self time kept as it was.

    The self times were computed with those rows in the tree (torch 2.15
    builds its tree with Python functions, then leaves them out of
    ``key_averages``). A kept row's parent becomes its nearest kept ancestor.
    ``per_row`` holds the session's per-row values (``stacks``, ``flops``,
    ``event_memory``, ``memory_owner``: memory owned by a dropped row is owned
    by none); a copy with them taken is returned.
    """
    keep = ~drop
    rows = np.flatnonzero(keep)
    parent = table.parent.astype(np.int64)
    dropped = np.append(drop, False)  # index -1 (no parent) is never dropped
    while dropped[parent].any():  # pointer jumping; -1 stays -1
        parent = np.where(dropped[parent], np.append(parent, -1)[parent], parent)
    source = copy.copy(table)
    source.parent = parent.astype(table.parent.dtype)
    out = dict(per_row)
    if out.get("stacks") is not None:
        out["stacks"] = [out["stacks"][i] for i in rows.tolist()]
    if out.get("flops") is not None:
        out["flops"] = out["flops"][rows]
    if out.get("event_memory") is not None:
        out["event_memory"] = {k: v[rows] for k, v in out["event_memory"].items()}
    if out.get("memory_owner") is not None:
        remap = np.full(len(keep) + 1, -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        owner = np.asarray(out["memory_owner"])
        out["memory_owner"] = remap[owner].astype(owner.dtype)
    return source.take(keep), out
