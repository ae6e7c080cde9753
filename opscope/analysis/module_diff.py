"""Two sessions module by module: forward and backward time of each call path, and the change.

Modules are matched by call path (``Sequential > 0 (Block) > 0.fc1 (Linear)``), so an eager
trace and a trace of the same model under ``torch.compile`` (whose inner modules opscope
finds inside the graphs, ``analysis.compiled_modules``) line up row by row. Rows keep the
module tree's order (A's, then B's modules that A lacks).

Example (two synthetic sessions, one module range each)::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.modules import ModuleInfo
    >>> from opscope.model.records import NO_INPUTS, SCOPE_USER, RawSession, records_from_rows
    >>> def one(us):
    ...     rows = [(0, us * 1000, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0)]
    ...     return build_session(RawSession(records_from_rows(rows), [], [1], ["Net"], 0,
    ...                          us * 1000, 0, modules={"Net": ModuleInfo.for_module("", "Net",
    ...                          "Net")}))
    >>> [(r.path, r.forward_us, r.change_us) for r in module_diff(one(10), one(4))]
    [('Net', (10.0, 4.0), -6.0)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from opscope.model.session import ProfileSession

PATH_SEPARATOR = " > "


@dataclass
class ModuleDiffRow:
    """One module call path on both sides (A, B); times in microseconds, 0 where absent."""

    path: str
    depth: int
    calls: Tuple[int, int]
    forward_us: Tuple[float, float]
    backward_us: Tuple[float, float]

    @property
    def total_us(self) -> Tuple[float, float]:
        return (self.forward_us[0] + self.backward_us[0],
                self.forward_us[1] + self.backward_us[1])

    @property
    def change_us(self) -> float:
        """B's forward + backward time minus A's."""
        a, b = self.total_us
        return b - a


def _paths(session: ProfileSession) -> Dict[str, Tuple[int, int, float, float]]:
    """Call path -> (depth, calls, forward us, backward us), in the module tree's order."""
    from opscope.analysis.modules import module_rows

    out: Dict[str, Tuple[int, int, float, float]] = {}
    paths: List[str] = []
    for row in module_rows(session):
        path = row.key if row.parent < 0 else paths[row.parent] + PATH_SEPARATOR + row.key
        paths.append(path)
        out[path] = (row.depth, row.count, row.forward_time_total, row.backward_time_total)
    return out


def module_diff(a: ProfileSession, b: ProfileSession) -> List[ModuleDiffRow]:
    """Both sessions' modules, matched by call path (see the module doc)."""
    side_a, side_b = _paths(a), _paths(b)
    rows = []
    for path in list(side_a) + [p for p in side_b if p not in side_a]:
        da, ca, fa, ba = side_a.get(path, (0, 0, 0.0, 0.0))
        db, cb, fb, bb = side_b.get(path, (0, 0, 0.0, 0.0))
        rows.append(ModuleDiffRow(path, max(da, db) if path in side_a else db,
                                  (ca, cb), (fa, fb), (ba, bb)))
    return rows
