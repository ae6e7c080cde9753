"""What made one step slower than another: self time per op name, the slow step minus a
typical one.

``step_difference(table, slow, typical)`` sums each op's self time over the
events that start within each step (two ``(start_ns, end_ns)`` windows on
the session's clock) and returns the names whose self time grew the most,
largest first, with both sums. The black box puts it in a ``slow_step``
dump's metadata, so the trace itself says which ops account for the step.

Example::

    >>> import numpy as np
    >>> from opscope.model.events import EventTable, SymbolTable
    >>> symbols = SymbolTable(["aten::mm", "aten::add"])
    >>> columns = {c: np.zeros(4, np.int64) for c in EventTable.COLUMNS}
    >>> columns.update(name_id=np.array([0, 1, 0, 1]), start_ns=np.array([0, 5, 100, 105]) * 1000,
    ...                end_ns=np.array([5, 10, 105, 190]) * 1000)
    >>> table = EventTable(symbols, columns)
    >>> step_difference(table, slow=(100_000, 200_000), typical=(0, 50_000))
    [{'name': 'aten::add', 'slow_us': 85.0, 'typical_us': 5.0, 'extra_us': 80.0}]
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from opscope.model.events import EventTable


def step_difference(table: EventTable, slow: Tuple[int, int], typical: Tuple[int, int],
                    top: int = 5) -> List[Dict[str, Any]]:
    """The ``top`` op names whose self time grew most from ``typical`` to ``slow``."""
    rows = step_rows(table, slow, typical)
    return [{k: r[k] for k in ("name", "slow_us", "typical_us", "extra_us")}
            for r in rows[:top] if r["extra_us"] > 0]


def step_rows(table: EventTable, slow: Tuple[int, int],
              typical: Tuple[int, int]) -> List[Dict[str, Any]]:
    """Every op name that ran in either step, op by op: calls and self time in each,
    largest growth first (the diff view of two steps)."""
    size = len(table.symbols)
    if len(table) == 0 or size == 0:
        return []
    slow_ns, slow_calls = _self_by_name(table, slow, size)
    typical_ns, typical_calls = _self_by_name(table, typical, size)
    extra = slow_ns - typical_ns
    ran = np.flatnonzero((slow_calls > 0) | (typical_calls > 0))
    order = ran[np.argsort(-extra[ran], kind="stable")]
    return [{"name": table.symbols[int(i)], "slow_us": int(slow_ns[i]) / 1e3,
             "typical_us": int(typical_ns[i]) / 1e3, "extra_us": int(extra[i]) / 1e3,
             "slow_calls": int(slow_calls[i]), "typical_calls": int(typical_calls[i])}
            for i in order]


def _self_by_name(table: EventTable, window: Tuple[int, int], size: int):
    """(self ns, calls) per name id, of the events that start within ``window``."""
    start = table.start_ns
    inside = (start >= window[0]) & (start < window[1])
    names = table.name_id[inside]
    return (np.bincount(names, weights=table.self_ns[inside], minlength=size).astype(np.int64),
            np.bincount(names, minlength=size))
