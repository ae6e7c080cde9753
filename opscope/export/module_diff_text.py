"""``opscope diff A B --group-by module``: one line per module, both sides' forward and
backward time and the change (``analysis.module_diff``).

Example::

    >>> from opscope.analysis.module_diff import ModuleDiffRow
    >>> print(format_module_diff([ModuleDiffRow("Net", 0, (1, 1), (10.0, 4.0), (20.0, 8.0))],
    ...                          names=("eager.json", "compiled.json")))
    A: eager.json
    B: compiled.json
    Modules by call path (forward + backward = total; change = B - A):
    ------  -------  --------  --------  -------  -------  -------  ---------  ------
    Module  Calls A     Fwd A     Bwd A  Calls B    Fwd B    Bwd B     Change  %
    ------  -------  --------  --------  -------  -------  -------  ---------  ------
    Net           1  10.000us  20.000us        1  4.000us  8.000us  -18.000us  -60.0%
    ------  -------  --------  --------  -------  -------  -------  ---------  ------
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from opscope.analysis.module_diff import PATH_SEPARATOR, ModuleDiffRow
from opscope.export.diff_text import signed_time
from opscope.export.table import format_time

HEADER = ("Module", "Calls A", "Fwd A", "Bwd A", "Calls B", "Fwd B", "Bwd B", "Change", "%")
GAP = "  "


def module_cells(row: ModuleDiffRow) -> List[str]:
    """One row's cells as text (the name indented by its depth)."""
    name = "  " * row.depth + row.path.split(PATH_SEPARATOR)[-1]
    a, _ = row.total_us
    share = f"{100.0 * row.change_us / a:+.1f}%" if a else "new"
    return [name, str(row.calls[0]), format_time(row.forward_us[0]),
            format_time(row.backward_us[0]), str(row.calls[1]), format_time(row.forward_us[1]),
            format_time(row.backward_us[1]), signed_time(row.change_us), share]


def format_module_diff(rows: Sequence[ModuleDiffRow], *,
                       names: Tuple[str, str] = ("A", "B")) -> str:
    """The module diff as text: both sides named, then one aligned line per module."""
    body = [module_cells(r) for r in rows]
    widths = [max(len(line[k]) for line in body + [list(HEADER)]) for k in range(len(HEADER))]
    rule = GAP.join("-" * w for w in widths)

    def line(cells: List[str]) -> str:
        return GAP.join([cells[0].ljust(widths[0])] + [c.rjust(w) if k < 7 else c.ljust(w)
                        for k, (c, w) in enumerate(zip(cells[1:], widths[1:]))]).rstrip()

    return "\n".join([f"A: {names[0]}", f"B: {names[1]}",
                      "Modules by call path (forward + backward = total; change = B - A):",
                      rule, line(list(HEADER)), rule] + [line(c) for c in body] + [rule])
