"""A session diff (``analysis.diff``) as a plain-text table, the way ``opscope diff`` prints it.

Times use the table's units (``format_time``); changes carry a sign. The
``Change`` column marks ``REGRESSION`` and ``improved`` rows, and ``new`` /
``gone`` for ops present on one side only. Plain ASCII, so any terminal or
log shows it.

Example::

    >>> from opscope.analysis.diff import DiffRow, SessionDiff
    >>> d = SessionDiff([DiffRow("aten::mm", (1, 2), (10.0, 30.0), (10.0, 30.0),
    ...                          status="regression")], self_total_us=(10.0, 30.0))
    >>> print(format_diff(d, names=("a.json", "b.json")))  # doctest: +NORMALIZE_WHITESPACE
    A: a.json
    B: b.json
    Self CPU time total: 10.000us -> 30.000us (+20.000us, +200.0%)
    1 regression, 0 improvements (threshold: 10% of the op's self time and 1% of the total)
    <BLANKLINE>
    Ops, by absolute change of self CPU time:
    ...
    aten::mm  10.000us  30.000us  +20.000us  +200.0%  10.000us  30.000us  +20.000us  1  2  +1  REGRESSION
    ...
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from opscope.analysis.diff import DiffRow, SessionDiff
from opscope.export.table import format_time

COLUMNS = ("Self CPU A", "Self CPU B", "Self change", "Self %", "CPU total A", "CPU total B",
           "Total change", "Calls A", "Calls B", "Calls change", "Change")
NAME_WIDTH = 55
GAP = "  "


def signed_time(us: float) -> str:
    """A time change with its sign: ``+1.234ms``, ``-5.000us``, ``0``.

    >>> signed_time(1234.0), signed_time(-5.0), signed_time(0.0)
    ('+1.234ms', '-5.000us', '0')
    """
    if us == 0:
        return "0"
    return ("+" if us > 0 else "-") + format_time(abs(us))


def count_text(calls: float, signed: bool = False) -> str:
    """Calls: whole numbers as they are, per-step averages with two decimals.

    >>> count_text(3), count_text(2.0), count_text(1.6667), count_text(-0.5, True)
    ('3', '2', '1.67', '-0.50')
    """
    if calls == 0 and signed:
        return "0"
    sign = "+" if signed else ""
    if float(calls).is_integer():
        return f"{int(calls):{sign}d}"
    return f"{calls:{sign}.2f}"


def signed_percent(row: DiffRow) -> str:
    """Self time change in percent of A's, ``new``/``gone`` when one side has none."""
    if row.presence == "new":
        return "new"
    if row.presence == "gone":
        return "gone"
    relative = row.relative_self
    if relative is None or row.delta_self == 0:
        return "0"
    return f"{relative:+.1f}%"


def change_mark(row: DiffRow) -> str:
    """``REGRESSION``/``improved``, with ``new``/``gone`` for one-sided rows."""
    mark = {"regression": "REGRESSION", "improvement": "improved"}.get(row.status, "")
    if row.presence != "both":
        mark = f"{mark} ({row.presence})" if mark else row.presence
    return mark


def _cells(row: DiffRow) -> List[str]:
    return [format_time(row.self_us[0]), format_time(row.self_us[1]),
            signed_time(row.delta_self), signed_percent(row),
            format_time(row.total_us[0]), format_time(row.total_us[1]),
            signed_time(row.delta_total), count_text(row.calls[0]), count_text(row.calls[1]),
            count_text(row.delta_calls, signed=True), change_mark(row)]


def _shorten(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def format_rows(rows: Sequence[DiffRow], title: str, row_limit: int = -1) -> str:
    """One section: a title line, then the rows as aligned columns."""
    shown = list(rows) if row_limit < 0 else list(rows)[:row_limit]
    body = [[_shorten(r.key, NAME_WIDTH)] + _cells(r) for r in shown]
    header = ["Name"] + list(COLUMNS)
    widths = [max(len(line[k]) for line in body + [header]) for k in range(len(header))]
    rule = GAP.join("-" * w for w in widths)

    def line(cells: List[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:-1], widths[1:-1])]
        return GAP.join([first] + rest + [cells[-1].ljust(widths[-1])]).rstrip()

    out = [title, rule, line(header), rule] + [line(cells) for cells in body] + [rule]
    if len(shown) < len(rows):
        hidden = len(rows) - len(shown)
        out.append(f"({hidden} more row{'' if hidden == 1 else 's'}; --limit -1 shows all)")
    return "\n".join(out)


def summary_lines(diff: SessionDiff, names: Tuple[str, str]) -> List[str]:
    """The lines above the tables: both sides, the total change, the counts."""
    a, b = diff.self_total_us
    change = b - a
    share = f", {100.0 * change / a:+.1f}%" if a else ""
    n_reg, n_imp = len(diff.regressions), len(diff.improvements)
    per_step = []
    if diff.steps is not None:
        per_step = [f"Per step: A has {diff.steps[0]} step{'' if diff.steps[0] == 1 else 's'}, "
                    f"B has {diff.steps[1]}; times and calls are per step"]
    return [
        f"A: {names[0]}",
        f"B: {names[1]}",
        *per_step,
        f"Self CPU time {'per step' if per_step else 'total'}: {format_time(a)} -> "
        f"{format_time(b)} ({signed_time(change)}{share})",
        f"{n_reg} regression{'' if n_reg == 1 else 's'}, {n_imp} improvement"
        f"{'' if n_imp == 1 else 's'} (threshold: {diff.threshold_pct:g}% of the op's self "
        f"time and {diff.noise_pct:g}% of the total)",
    ]


def format_diff(diff: SessionDiff, *, names: Tuple[str, str] = ("A", "B"),
                row_limit: int = -1) -> str:
    """The whole text report: summary, then ops (and modules) by absolute change."""
    lines = summary_lines(diff, names)
    if diff.unchanged:
        lines.append("No change: both traces have the same ops, calls and times.")
        return "\n".join(lines)
    lines.append("")
    lines.append(format_rows(diff.ops, "Ops, by absolute change of self CPU time:", row_limit))
    if diff.modules:
        lines.append("")
        lines.append(format_rows(diff.modules, "Modules (forward + backward), by absolute "
                                               "change of self CPU time:", row_limit))
    return "\n".join(lines)

