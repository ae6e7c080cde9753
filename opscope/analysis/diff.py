"""Compare two sessions op by op (and module by module): what got slower, what faster.

Each side is aggregated as ``key_averages`` aggregates it (one row per name,
user ranges apart from ops); rows are matched by name and hold both sides'
calls, self time and total time. Rows are sorted by the absolute change of
self time, the time an op spends in itself, so the op that changed most
comes first whatever its callers did.

A row is a *regression* when its self time grew by at least ``threshold_pct``
percent of what it was (any growth for a new op) *and* by at least
``noise_pct`` percent of the larger of the two sessions' total self time: a
change that small is within run-to-run noise. *Improvement* is the mirror.

When both sides have steps (``ProfilerStep#N`` ranges, else optimizer steps:
``analysis.steps.step_count``), times and calls are compared per step, so that
a window of 5 steps is not "slower" than one of 3; ``SessionDiff.steps`` then
holds both counts.

With module data (``with_modules``) on both sides, module ranges are compared
as a separate list, one row per call path (``Net > encoder (Encoder)``), with
forward + backward time as ``analysis.modules.module_rows`` computes it.

Example::

    >>> row = DiffRow("aten::mm", (2, 2), (10.0, 30.0), (10.0, 30.0))
    >>> row.delta_self, row.relative_self
    (20.0, 200.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from opscope.analysis.aggregate import key_averages
from opscope.model.session import ProfileSession

DEFAULT_THRESHOLD_PCT = 10.0
DEFAULT_NOISE_PCT = 1.0
MODULE_PATH_SEPARATOR = " > "


@dataclass
class DiffRow:
    """One op (or module call path) on both sides; A is the baseline, B the new run.

    Pairs are ``(A, B)``; times in microseconds. A side where it is absent has
    zero calls and times. ``status`` is ``"regression"``, ``"improvement"``,
    ``"unchanged"`` (equal on both sides) or ``""`` (changed, within noise).

    >>> DiffRow("aten::add", (0, 3), (0.0, 5.0), (0.0, 5.0)).presence
    'new'
    """

    key: str
    calls: Tuple[float, float]  # whole numbers, unless compared per step
    self_us: Tuple[float, float]
    total_us: Tuple[float, float]
    status: str = ""
    is_user_annotation: bool = False

    @property
    def delta_self(self) -> float:
        """Self time after minus before, in us."""
        return self.self_us[1] - self.self_us[0]

    @property
    def delta_total(self) -> float:
        """Total time after minus before, in us."""
        return self.total_us[1] - self.total_us[0]

    @property
    def delta_calls(self) -> float:
        """Calls after minus before."""
        return self.calls[1] - self.calls[0]

    @property
    def relative_self(self) -> Optional[float]:
        """Change of self time in percent of A's, None when A had none."""
        if self.self_us[0] == 0:
            return None
        return 100.0 * self.delta_self / self.self_us[0]

    @property
    def presence(self) -> str:
        """``"new"`` (only in B), ``"gone"`` (only in A) or ``"both"``."""
        if self.calls[0] == 0 and self.calls[1] > 0:
            return "new"
        if self.calls[1] == 0 and self.calls[0] > 0:
            return "gone"
        return "both"


@dataclass
class SessionDiff:
    """The comparison of two sessions: op rows, module rows, totals.

    ``self_total_us`` is each side's total self CPU time (the table's "Self CPU
    time total"); ``modules`` is empty unless both sides recorded modules.
    ``steps`` is (A's steps, B's steps) when the rows are per step, else None.
    """

    ops: List[DiffRow]
    modules: List[DiffRow] = field(default_factory=list)
    self_total_us: Tuple[float, float] = (0.0, 0.0)
    events: Tuple[int, int] = (0, 0)
    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    noise_pct: float = DEFAULT_NOISE_PCT
    steps: Optional[Tuple[int, int]] = None

    @property
    def regressions(self) -> List[DiffRow]:
        """Op and module rows that got slower beyond the threshold."""
        return [r for r in self.ops + self.modules if r.status == "regression"]

    @property
    def improvements(self) -> List[DiffRow]:
        """Op and module rows that got faster beyond the threshold."""
        return [r for r in self.ops + self.modules if r.status == "improvement"]

    @property
    def unchanged(self) -> bool:
        """True when every row has the same calls and times on both sides."""
        return all(r.status == "unchanged" for r in self.ops + self.modules)


def op_side(rows, module_names=None) -> Dict[Tuple[str, bool], Tuple[int, float, float]]:
    """(name, is user range) -> (calls, self us, total us) of ``key_averages`` rows, the
    ranges of modules (``module_names``) left out."""
    modules = module_names or ()
    out = {}
    for row in rows:
        if row.is_user_annotation and row.key in modules:
            continue
        out[(row.key, row.is_user_annotation)] = (row.count, row.self_cpu_time_total,
                                                  row.cpu_time_total)
    return out


@dataclass
class DiffSide:
    """One side of a diff, aggregated: op rows, module rows (None: not compared), totals.

    A session gives one (``session_side``); so can any source that aggregates as
    ``key_averages`` does (a store, in DuckDB).
    """

    ops: Dict[Tuple[str, bool], Tuple[int, float, float]]
    modules: Optional[Dict[str, Tuple[int, float, float]]]
    self_total_us: float
    events: int
    steps: int = 0  # analysis.steps.step_count; 0: none

    def per_step(self) -> "DiffSide":
        """This side with calls and times divided by its steps.

        >>> DiffSide({("a", False): (6, 3.0, 9.0)}, None, 3.0, 6, steps=3).per_step().ops
        {('a', False): (2.0, 1.0, 3.0)}
        """
        n = self.steps

        def scaled(rows):
            return {k: (c / n, s / n, t / n) for k, (c, s, t) in rows.items()}

        return DiffSide(scaled(self.ops), scaled(self.modules) if self.modules is not None
                        else None, self.self_total_us / n, self.events, n)


def session_side(session: ProfileSession, with_modules: bool = True) -> DiffSide:
    """The diff side of a session; its modules only ``with_modules`` and when recorded."""
    from opscope.analysis.steps import step_count

    modules = _module_sides(session) if with_modules and session.modules else None
    return DiffSide(op_side(key_averages(session.table), session.modules), modules,
                    float(session.table.self_ns.sum()) / 1000.0, len(session.table),
                    step_count(session))


def _module_sides(session: ProfileSession) -> Dict[str, Tuple[int, float, float]]:
    """Module call path -> (calls, self us, total us), forward + backward."""
    from opscope.analysis.modules import module_rows

    rows = module_rows(session)
    paths: List[str] = []
    out = {}
    for row in rows:
        path = row.key if row.parent < 0 else paths[row.parent] + MODULE_PATH_SEPARATOR + row.key
        paths.append(path)
        out[path] = (row.count, row.self_cpu_time_total, row.cpu_time_total)
    return out


def _rows(a: Dict, b: Dict) -> List[DiffRow]:
    zero = (0, 0.0, 0.0)
    out = []
    for key in list(a) + [k for k in b if k not in a]:
        ca, sa, ta = a.get(key, zero)
        cb, sb, tb = b.get(key, zero)
        name, user = key if isinstance(key, tuple) else (key, True)
        out.append(DiffRow(name, (ca, cb), (sa, sb), (ta, tb), is_user_annotation=user))
    return out


def _classify(rows: List[DiffRow], noise_us: float, threshold_pct: float) -> None:
    for row in rows:
        if row.calls[0] == row.calls[1] and row.self_us[0] == row.self_us[1] \
                and row.total_us[0] == row.total_us[1]:
            row.status = "unchanged"
            continue
        delta = row.delta_self
        base = row.self_us[0]
        big_enough = abs(delta) >= noise_us and abs(delta) > 0
        relative = base == 0 or abs(delta) >= threshold_pct / 100.0 * base
        if big_enough and relative:
            row.status = "regression" if delta > 0 else "improvement"
        else:
            row.status = ""


def _sorted(rows: List[DiffRow]) -> List[DiffRow]:
    return sorted(rows, key=lambda r: (-abs(r.delta_self), -abs(r.delta_total),
                                       -abs(r.delta_calls), r.key))


def diff_sessions(a: ProfileSession, b: ProfileSession, *,
                  threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                  noise_pct: float = DEFAULT_NOISE_PCT) -> SessionDiff:
    """Compare ``b`` (the new run) against ``a`` (the baseline).

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> empty = build_session(RawSession.empty())
    >>> diff_sessions(empty, empty).unchanged
    True
    """
    both = bool(a.modules and b.modules)
    return diff_sides(session_side(a, both), session_side(b, both),
                      threshold_pct=threshold_pct, noise_pct=noise_pct)


def diff_sides(a: DiffSide, b: DiffSide, *, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
               noise_pct: float = DEFAULT_NOISE_PCT) -> SessionDiff:
    """Compare side ``b`` against side ``a``; modules when both sides have them; per step
    when both have steps."""
    steps = None
    if a.steps > 0 and b.steps > 0:
        steps, a, b = (a.steps, b.steps), a.per_step(), b.per_step()
    totals = (a.self_total_us, b.self_total_us)
    noise_us = noise_pct / 100.0 * max(totals)
    ops = _rows(a.ops, b.ops)
    _classify(ops, noise_us, threshold_pct)
    modules: List[DiffRow] = []
    if a.modules is not None and b.modules is not None:
        modules = _rows(a.modules, b.modules)
        _classify(modules, noise_us, threshold_pct)
    return SessionDiff(_sorted(ops), _sorted(modules), totals, (a.events, b.events),
                       threshold_pct, noise_pct, steps)
