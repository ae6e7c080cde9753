"""The Operators view: ``key_averages()`` rows plus per-op details.

The rows are exactly ``opscope.analysis.aggregate.key_averages`` over the
session (same keys, same order, same counts), so the page shows what
``prof.key_averages().table()`` prints; ``communication`` marks a collective
(``c10d::allreduce_``, or a backend range such as ``gloo:all_reduce``). Per row,
the details hold the most frequent input shapes (with ``record_shapes``), the
ranges and ops it was called from, and its Python call sites (with
``with_stack``), each capped.
A call site is ``[frames, calls, self us, frames with torch's]``: the frames
innermost first without torch's plumbing (``opscope.analysis.frames``), so the
user's own lines come first and fit the cap, grouped by those; the last item is
one such stack with torch's frames kept (None when it has none).

Example::

    >>> import numpy as np
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> rows = [(0, 50_000, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0),
    ...         (10_000, 30_000, -1, 1, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)]
    >>> raw = RawSession(records_from_rows(rows), [], [1], ["step", "aten::mm"], 0, 60_000, 0)
    >>> ops = operator_rows(build_session(raw))
    >>> [(r["name"], r["calls"], r["self_us"]) for r in ops["rows"]]
    [('step', 1, 30.0), ('aten::mm', 1, 20.0)]
    >>> ops["rows"][1]["callers"]
    [['step', 1, 20.0]]
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from opscope.analysis.aggregate import key_averages
from opscope.analysis.collectives import collective_kind
from opscope.analysis.facts import event_flops, event_memory, shapes_recorded
from opscope.analysis.frames import fold_frames, is_plumbing
from opscope.analysis.op_details import caller_names, key_rows, top_groups
from opscope.model.session import ProfileSession

DETAIL_LIMIT = 8  # shapes, callers, call sites shown per op
STACK_FRAMES = 12  # innermost frames kept per call site


def _round(x: float) -> float:
    return round(float(x), 3)


def operator_rows(session: ProfileSession) -> Dict[str, Any]:
    """Rows of the operator table and the flags saying which columns have data."""
    table = session.table
    flops = event_flops(session)
    memory = event_memory(session)
    rows = key_averages(table, memory=memory, flops=flops)
    event_row = key_rows(table)
    shapes = (_shape_details(session, event_row, len(rows)) if shapes_recorded(session)
              else None)
    callers = _caller_details(session, event_row, len(rows))
    sites = _stack_details(session, event_row, len(rows)) if session.stacks else None
    out: List[Dict[str, Any]] = []
    self_total = float(table.self_ns.sum()) / 1000.0 if len(table) else 0.0
    for r, row in enumerate(rows):
        out.append({
            "name": row.key, "calls": row.count, "self_us": _round(row.self_cpu_time_total),
            "total_us": _round(row.cpu_time_total), "user": bool(row.is_user_annotation),
            "communication": collective_kind(row.key) is not None,
            "flops": int(row.flops), "cpu_mem": int(row.cpu_memory_usage),
            "self_cpu_mem": int(row.self_cpu_memory_usage),
            "shapes": shapes[r] if shapes is not None else None,
            "callers": callers[r],
            "stacks": sites[r] if sites is not None else None,
        })
    return {"rows": out, "self_total_us": _round(self_total),
            "has_shapes": shapes is not None, "has_stacks": sites is not None,
            "has_flops": flops is not None, "has_memory": memory is not None}


def _shape_details(session: ProfileSession, event_row: np.ndarray, n_rows: int) -> List[list]:
    sig, decoded = session.table.input_signatures()
    texts = [str(rec.shapes) for rec in decoded]
    groups = top_groups(event_row, sig, session.table.self_ns / 1000.0, n_rows, DETAIL_LIMIT)
    return [[[texts[k], c, _round(w)] for k, c, w in g] for g in groups]


def _caller_details(session: ProfileSession, event_row: np.ndarray, n_rows: int) -> List[list]:
    table = session.table
    if len(table) == 0:
        return [[] for _ in range(n_rows)]
    callers, names = caller_names(table)
    # ids in name order, so that callers of equal time come in name order from any source
    # (a trace file and a store number their names differently)
    by_name = np.argsort(np.array(names, dtype=object), kind="stable")
    new_id = np.empty(len(names), dtype=np.int64)
    new_id[by_name] = np.arange(len(names))
    callers = np.where(callers >= 0, new_id[np.maximum(callers, 0)], -1)
    names = [names[k] for k in by_name.tolist()]
    groups = top_groups(event_row, callers, table.self_ns / 1000.0, n_rows, DETAIL_LIMIT)
    return [[[names[k], c, _round(w)] for k, c, w in g] for g in groups]


def _stack_details(session: ProfileSession, event_row: np.ndarray,
                   n_rows: int) -> Optional[List[list]]:
    stacks = session.stacks or []
    ids: Dict[tuple, int] = {}
    full: List[Optional[list]] = []
    label = np.full(len(event_row), -1, dtype=np.int64)
    folded_of: Dict[tuple, tuple] = {}
    for i, frames in enumerate(stacks):
        if not frames:
            continue
        whole = tuple(frames)
        key = folded_of.get(whole)
        if key is None:
            key = folded_of[whole] = tuple(fold_frames(frames)[:STACK_FRAMES])
        k = ids.get(key)
        if k is None:
            k = ids[key] = len(ids)
            full.append(_with_torch_frames(frames, len(key)))
        label[i] = k
    if not ids:
        return None
    frames_of = list(ids)
    groups = top_groups(event_row, label, session.table.self_ns / 1000.0, n_rows,
                         DETAIL_LIMIT)
    return [[[list(frames_of[k]), c, _round(w), full[k]] for k, c, w in g] for g in groups]


def _with_torch_frames(frames: list, kept: int) -> Optional[list]:
    """``frames`` up to the ``kept``-th frame that folding keeps; None if nothing is folded."""
    out, seen = [], 0
    for frame in frames:
        if seen == kept:
            break
        out.append(frame)
        seen += not is_plumbing(frame)
    return None if len(out) == kept else out
