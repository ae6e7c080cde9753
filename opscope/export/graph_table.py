"""``opscope table TRACE --group-by graph``: one line per torch.compile'd graph.

Example::

    >>> from opscope.analysis.compiled_graphs import GraphRow
    >>> print(format_graph_table([GraphRow("fabc", "forward", "0/0", "train.py(9): step", 3,
    ...                                    1500.0, 4, 97.5)], {"a Python builtin": 2}))
    -----  ---------  -----  -----  -------  -------  ----------  -----------------
    Graph  Direction  Frame  Calls     Time  Kernels  In modules  Called from
    -----  ---------  -----  -----  -------  -------  ----------  -----------------
    fabc   forward    0/0        3  1.500ms        4       97.5%  train.py(9): step
    -----  ---------  -----  -----  -------  -------  ----------  -----------------
    Graph breaks so far in the process (reason: count):
      a Python builtin: 2
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from opscope.analysis.compiled_graphs import GraphRow
from opscope.export.table import format_time

HEADER = ("Graph", "Direction", "Frame", "Calls", "Time", "Kernels", "In modules", "Called from")
KEY_WIDTH = 12
GAP = "  "


def _cells(row: GraphRow) -> List[str]:
    return [row.key[:KEY_WIDTH], row.direction, row.frame or "-", str(row.calls),
            format_time(row.time_us), str(row.kernels), f"{row.in_modules_pct:.1f}%",
            row.caller or "-"]


def format_graph_table(rows: Sequence[GraphRow], breaks: Dict[str, int]) -> str:
    """The compiled graphs as aligned columns, then the graph breaks (if any)."""
    if not rows:
        return "No torch.compile'd graph ran in this recording."
    body = [_cells(r) for r in rows]
    widths = [max(len(line[k]) for line in body + [list(HEADER)]) for k in range(len(HEADER))]
    rule = GAP.join("-" * w for w in widths)
    numeric = {3, 4, 5, 6}

    def line(cells: List[str]) -> str:
        return GAP.join(c.rjust(w) if k in numeric else c.ljust(w)
                        for k, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [rule, line(list(HEADER)), rule] + [line(c) for c in body] + [rule]
    if breaks:
        out.append("Graph breaks so far in the process (reason: count):")
        out.extend(f"  {' '.join(reason.split())[:200]}: {count}" for reason, count in breaks.items())
    return "\n".join(out)
