"""A store's windows, chosen as the verbs choose them, and what was recorded in them.

``store_windows(con)`` lists every (rank, window) of a store from its ``sessions``
view: name, source, aligned start and options. ``choose_windows`` picks the ones a
verb reads:

- no ``--rank``/``--window``: the lowest rank's newest window (latest start), as a
  trace folder's newest trace is read;
- ``--rank R``: rank R's newest window; ``--window W``: window W of the lowest rank
  that has it; both: that one window;
- ``--rank all``: every rank, each its newest window (or window W); ``--window all``:
  every window of the chosen rank (the lowest by default). The verbs add the
  chosen windows up.

``recorded(con, windows)`` says what the chosen windows hold (shapes, stacks,
FLOPs, memory, events), as the checks of ``opscope table`` ask a session;
``windows_need`` about the memory their rows take, from their files' footers
(``opscope.store.budget``), and ``check_rank_memory`` refuses a store whose ranks'
rows need more than a limit.

Example::

    >>> ws = [StoreWindow(0, 0, "a", "", 10, {}), StoreWindow(0, 1, "b", "", 20, {}),
    ...       StoreWindow(1, 0, "a", "", 11, {})]
    >>> [(w.rank, w.window) for w in choose_windows(ws, None, None, "s")]
    [(0, 1)]
    >>> [(w.rank, w.window) for w in choose_windows(ws, "all", "0", "s")]
    [(0, 0), (1, 0)]
    >>> [(w.rank, w.window) for w in choose_windows(ws, None, "all", "s")]
    [(0, 0), (0, 1)]
    >>> choose_windows(ws, "2", None, "s")
    Traceback (most recent call last):
    ...
    opscope.store.schema.StoreError: store 's' has no rank 2 (its ranks: 0, 1)
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence

from opscope.model.session import OPTION_NAMES
from opscope.store.aggregate_sql import chosen_sql
from opscope.store.budget import SESSION_FACTOR, check_memory, rows_size
from opscope.store.connect import file_footers, part_files
from opscope.store.folder import partition_files
from opscope.store.parts import RECORDED_TABLES
from opscope.store.schema import StoreError, load_json

ALL = "all"


class StoreWindow(NamedTuple):
    """One (rank, window) of a store, from its ``sessions`` row."""

    rank: int
    window: int
    name: str  # window_name: ``step3``, or the source file's name
    source_path: str
    start_ns: int  # aligned Unix ns
    options: Dict[str, bool]

    @property
    def label(self) -> str:
        """``rank 0, window 2 (step3)``: how messages name it."""
        return f"rank {self.rank}, window {self.window} ({self.name})"


def _options(text: Optional[str]) -> Dict[str, bool]:
    try:
        doc = load_json(text or "{}")
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    return {k: doc.get(k) is True for k in OPTION_NAMES}


def store_windows(con) -> List[StoreWindow]:
    """Every window of the store, by rank then window number."""
    rows = con.execute(
        'SELECT rank, "window", window_name, source_path, start_ns, options FROM sessions '
        'ORDER BY rank, "window"').fetchall()
    return [StoreWindow(int(r), int(w), str(name or ""), str(path or ""), int(start or 0),
                        _options(options)) for r, w, name, path, start, options in rows]


def _pick(text: Optional[str], what: str) -> Optional[int]:
    """None for all, else the int of ``text``; StoreError naming the option."""
    if text == ALL:
        return None
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise StoreError(f"argument --{what}: expected a {what} number >= 0 or 'all'; "
                         f"got {text!r}")
    return value


def _newest(windows: Sequence[StoreWindow]) -> StoreWindow:
    return max(windows, key=lambda w: (w.start_ns, w.window))


def choose_windows(windows: Sequence[StoreWindow], rank: Optional[str], window: Optional[str],
                   store: str) -> List[StoreWindow]:
    """The windows ``--rank``/``--window`` (None: not given) choose; StoreError if none."""
    if not windows:
        raise StoreError(f"store {store!r} has no windows")
    ranks = sorted({w.rank for w in windows})
    want_window = _pick(window, "window") if window is not None else None
    if rank is not None:
        want_rank = _pick(rank, "rank")
    elif want_window is not None:  # the lowest rank that has that window
        want_rank = min([w.rank for w in windows if w.window == want_window], default=ranks[0])
    else:
        want_rank = ranks[0]
    if want_rank is not None and want_rank not in ranks:
        raise StoreError(f"store {store!r} has no rank {want_rank} (its ranks: "
                         f"{', '.join(map(str, ranks))})")
    mine = [w for w in windows if want_rank is None or w.rank == want_rank]
    if want_window is not None:
        mine = [w for w in mine if w.window == want_window]
        if not mine:
            raise StoreError(f"store {store!r} has no window {want_window}"
                             + (f" of rank {want_rank}" if want_rank is not None else ""))
        return mine
    if window == ALL:
        return mine
    return [_newest([w for w in mine if w.rank == r]) for r in sorted({w.rank for w in mine})]


def chosen_options(windows: Sequence[StoreWindow]) -> Dict[str, bool]:
    """An option is on when it is on in any of ``windows``."""
    return {k: any(w.options.get(k) for w in windows) for k in OPTION_NAMES}


class Recorded(NamedTuple):
    """What the chosen windows recorded, for the verbs' checks."""

    events: int
    inputs: bool  # some event has recorded inputs
    stacks: bool  # some event has a non-empty stack
    flops: bool  # FLOPs were estimated or read
    memory: bool  # per-event memory (profile_memory)
    self_ns: int  # the events' self time, summed


def recorded(con, windows: Sequence[StoreWindow]) -> Recorded:
    """What ``windows`` hold, in one pass over their events."""
    if not windows:
        return Recorded(0, False, False, False, False, 0)
    chosen = chosen_sql([(w.rank, w.window) for w in windows])
    n, inputs, flops, memory, self_ns = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE e.input_id >= 0), count(e.flops), "
        f"count(e.cpu_memory_usage), coalesce(sum(e.self_ns), 0) FROM events e "
        f"SEMI JOIN {chosen} ON e.rank = c.r AND e.\"window\" = c.w").fetchone()
    stacks = con.execute(
        f"SELECT count(*) FROM stacks s SEMI JOIN {chosen} ON s.rank = c.r "
        f"AND s.\"window\" = c.w WHERE len(s.frames) > 0").fetchone()[0]
    return Recorded(int(n), inputs > 0, stacks > 0, flops > 0, memory > 0, int(self_ns))


def windows_need(con, store: str, windows: Sequence[StoreWindow]) -> int:
    """About the memory the rows of ``windows`` take (``budget.rows_size``), from their
    files' footers as DuckDB reads them (``connect.file_footers``): no row is read."""
    path = os.path.abspath(store)
    need = 0
    for table in RECORDED_TABLES:
        files = [f for w in windows for f in partition_files(path, table, w.rank, w.window)]
        need += sum(rows_size(table, footer)
                    for _, _, footer in file_footers(con, files, store, table))
    return need


def check_rank_memory(con, store: str, limit: Optional[int]) -> None:
    """Refuse (StoreError) when the rows the ranks' analysis reads, every window's
    ``sessions`` row and every rank's ``collectives``, need more than ``limit`` as Python
    objects (``budget.SESSION_FACTOR`` times their size)."""
    path = os.path.abspath(store)
    need = sum(rows_size(table, footer) for table in ("sessions", "collectives")
               for _, _, footer in file_footers(con, part_files(path, table), store, table))
    check_memory(f"store {store!r} (its sessions and collectives rows)",
                 SESSION_FACTOR * need, limit)
