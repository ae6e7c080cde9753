"""key_averages of a store, computed in DuckDB: the rows ``opscope table STORE`` prints.

The SQL groups the ``events`` view exactly as ``opscope.analysis.aggregate.key_averages``
groups a session's table: by display name (``ProfilerStep#N`` shows as ``ProfilerStep*``)
and whether the event is a user range, then by input shapes (``input_dims``, ``[]`` when
none) or the N innermost frames when asked. Rows come in order of each key's first event
(rank, window, event_id), and the float totals are summed in that order too, so the
figures are the very doubles ``key_averages`` computes and the table prints the same
text. Only the rows leave DuckDB: no session of the store is built.
``store_diff_side`` gives ``opscope diff`` its side of a store the same way.

Utility ops (``aten::is_leaf`` ...) are not in a store: it holds the events of the built
session, which ``build_session`` already filtered.

Example::

    >>> key_sql("shape", 0).count("input_dims"), "frames" in key_sql("stack", 3)
    (1, True)
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from opscope.model.function_event import FunctionEventAvg
from opscope.model.records import FLAG_ASYNC, SCOPE_USER
from opscope.model.torch_names import PROFILER_STEP_PREFIX, PROFILER_STEP_WILDCARD
from opscope.store.schema import StoreError

Window = Tuple[int, int]  # (rank, window) of a store


class _Row(NamedTuple):
    """One row of ``aggregate_sql``'s result, in its column order."""

    key: str
    is_user: bool
    count: int
    total_us: float
    self_us: float
    mem: int
    self_mem: int
    flops: int
    scope: int
    is_async: bool
    rank: int  # the first event's rank, window and input signature
    window: int
    input_id: int
    frames: Optional[list]
    first: tuple


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def chosen_sql(windows: Sequence[Window]) -> str:
    """A ``VALUES`` relation ``c(r, w)`` of the chosen windows (ints only, so no quoting).

    >>> chosen_sql([(0, 1), (2, 3)])
    '(VALUES (0, 1), (2, 3)) c(r, w)'
    """
    pairs = ", ".join(f"({int(r)}, {int(w)})" for r, w in windows)
    return f"(VALUES {pairs}) c(r, w)"


def key_sql(group_kind: Optional[str], frames: int) -> str:
    """The per-event key columns ``shapes`` and ``frames`` for a grouping (NULL when not grouped)."""
    shapes = "coalesce(i.input_dims, '[]')" if group_kind == "shape" else "NULL::VARCHAR"
    stack = (f"coalesce(s.frames[1:{int(frames)}], [])" if group_kind == "stack" and frames > 0
             else "NULL::VARCHAR[]")
    return f"{shapes} AS shapes, {stack} AS frames"


def aggregate_sql(windows: Sequence[Window], group_kind: Optional[str] = None,
                  frames: int = 0) -> str:
    """The query: one row per key, in order of its first event."""
    step = _quoted(PROFILER_STEP_PREFIX)
    joins = ""
    if group_kind == "shape":
        joins += (" LEFT JOIN inputs i ON i.rank = e.rank AND i.\"window\" = e.\"window\""
                  " AND i.input_id = e.input_id")
    if group_kind == "stack":
        joins += (" LEFT JOIN stacks s ON s.rank = e.rank AND s.\"window\" = e.\"window\""
                  " AND s.stack_id = e.stack_id")
    order = "(e.rank, e.\"window\", e.event_id)"
    return f"""
WITH ev AS (
  SELECT CASE WHEN starts_with(e.name, {step}) THEN {_quoted(PROFILER_STEP_WILDCARD)}
              ELSE coalesce(e.name, '') END AS key,
         coalesce(e.scope, 0) = {SCOPE_USER} AS is_user, coalesce(e.scope, 0) AS scope,
         (coalesce(e.flags, 0) & {FLAG_ASYNC}) <> 0 AS is_async,
         {order} AS pos, e.rank, e."window", coalesce(e.input_id, -1) AS input_id,
         CAST(coalesce(e.dur_ns, 0) AS DOUBLE) / 1000.0 AS total_us,
         CAST(coalesce(e.self_ns, 0) AS DOUBLE) / 1000.0 AS self_us,
         coalesce(e.cpu_memory_usage, 0) AS mem, coalesce(e.self_cpu_memory_usage, 0) AS self_mem,
         coalesce(e.flops, 0) AS flops, {key_sql(group_kind, frames)}
  FROM events e SEMI JOIN {chosen_sql(windows)} ON e.rank = c.r AND e."window" = c.w
  {joins}
)
SELECT key, is_user, count(*) AS n,
       sum(total_us ORDER BY pos) AS total_us, sum(self_us ORDER BY pos) AS self_us,
       sum(mem) AS mem, sum(self_mem) AS self_mem, sum(flops) AS flops,
       arg_min(scope, pos) AS scope, arg_min(is_async, pos) AS is_async,
       arg_min(rank, pos) AS first_rank, arg_min("window", pos) AS first_window,
       arg_min(input_id, pos) AS first_input, any_value(frames) AS frames, min(pos) AS first
FROM ev GROUP BY key, is_user, shapes, frames ORDER BY first"""


def _first_shapes(con, rows: List[_Row], store: str) -> Dict[tuple, list]:
    """(rank, window, input_id) -> decoded input shapes, for each row's first event."""
    import numpy as np

    from opscope.model.records import decode_inputs

    wanted = sorted({(r.rank, r.window, r.input_id) for r in rows if r.input_id >= 0})
    if not wanted:
        return {}
    values = ", ".join(f"({int(a)}, {int(b)}, {int(c)})" for a, b, c in wanted)
    found = con.execute(
        f"SELECT i.rank, i.\"window\", i.input_id, i.words FROM inputs i SEMI JOIN "
        f"(VALUES {values}) k(r, w, n) ON i.rank = k.r AND i.\"window\" = k.w "
        f"AND i.input_id = k.n").fetchall()
    out = {}
    for r, w, n, words in found:
        try:
            out[(r, w, n)] = decode_inputs(np.asarray(words or [], dtype=np.int64), 0,
                                           len(words or [])).shapes
        except (IndexError, ValueError, TypeError, OverflowError):
            raise StoreError(f"store {store!r}: rank {r}, window {w}: malformed "
                             f"inputs.words of input {n}") from None
    return out


def store_key_averages(con, windows: Sequence[Window], *, group_by_input_shape: bool = False,
                       group_by_stack_n: int = 0, store: str = "store") -> List[FunctionEventAvg]:
    """One FunctionEventAvg per key over the events of ``windows``, as ``key_averages``.

    ``con`` is ``opscope.store.connect(STORE)``; several windows (or ranks) add up,
    keys ordered by their first event in (rank, window, event_id) order. ``store``
    names the store in errors.
    """
    if not windows:
        return []
    kind = "shape" if group_by_input_shape else "stack" if group_by_stack_n > 0 else None
    rows = [_Row(*r) for r in con.execute(aggregate_sql(windows, kind, group_by_stack_n))
            .fetchall()]
    shapes = _first_shapes(con, rows, store) if group_by_input_shape else {}
    return [FunctionEventAvg(
        r.key, count=int(r.count), cpu_time_total=float(r.total_us),
        self_cpu_time_total=float(r.self_us),
        input_shapes=shapes.get((r.rank, r.window, r.input_id), []) if group_by_input_shape
        else "", stack=list(r.frames or []), scope=int(r.scope), cpu_memory_usage=int(r.mem),
        self_cpu_memory_usage=int(r.self_mem), flops=int(r.flops), is_async=bool(r.is_async),
        is_user_annotation=bool(r.is_user)) for r in rows]


def module_names(con, windows: Sequence[Window]) -> Optional[set]:
    """The names of the modules recorded in ``windows`` (``sessions.extras``); None: none were."""
    if not windows:
        return None
    rows = con.execute(
        f"SELECT json_extract_string(s.extras, '$.modules[*].name') FROM sessions s "
        f"SEMI JOIN {chosen_sql(windows)} ON s.rank = c.r AND s.\"window\" = c.w").fetchall()
    found = [names for (names,) in rows if names is not None]
    return {str(n) for names in found for n in names if n is not None} if found else None


def store_diff_side(con, windows: Sequence[Window], session=None):
    """The ``analysis.diff.DiffSide`` of a store's ``windows``, aggregated in DuckDB.

    ``session``, the one window loaded when module rows are to be compared, gives
    them (``analysis.modules.module_rows`` needs the event tree); None: none.
    """
    from opscope.analysis.diff import DiffSide, op_side, session_side

    n, self_ns = con.execute(
        f"SELECT count(*), coalesce(sum(e.self_ns), 0) FROM events e SEMI JOIN "
        f"{chosen_sql(windows)} ON e.rank = c.r AND e.\"window\" = c.w").fetchone()
    (steps,) = con.execute(f"SELECT count(*) FROM steps s SEMI JOIN {chosen_sql(windows)} "
                           f"ON s.rank = c.r AND s.\"window\" = c.w").fetchone()
    modules = session_side(session).modules if session is not None else None
    return DiffSide(op_side(store_key_averages(con, windows), module_names(con, windows)),
                    modules, float(int(self_ns)) / 1000.0, int(n), int(steps))
