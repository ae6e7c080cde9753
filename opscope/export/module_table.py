"""The module tree as text: ``prof.module_table()`` / ``key_averages(group_by="module").table()``.

One line per module (``analysis.modules.ModuleRow``), indented two spaces per level,
with columns in the style of torch.profiler's table::

    Module  # of Calls  Params  Forward  Backward  Total  Self  Total %
        [Total MFLOPs  GFLOP/s]  [Self CUDA  CUDA total]  [Net CPU Mem  Self Net Mem]

``Forward`` and ``Backward`` include the children's time; ``Self`` is the module's
forward + backward time minus its children's. ``Total %`` is a share of the roots'
forward + backward time. FLOP columns appear with ``with_flops`` when a row has
FLOPs (scaled from the largest count, so the model's total reads below 1000);
device columns when a device was recorded: the kernels the module's forward and
backward ops launched, its own and with its submodules';
memory columns when the rows carry memory: ``Net CPU Mem`` is the bytes the
module's forward *and* backward ops allocated minus those they freed, its
submodules' included (``MEMORY_NOTE``, printed under the table, says so). It is not
the op table's ``CPU Mem`` of the module's range, which counts the forward alone:
backward frees most of what forward allocated, so the net is small, can be
negative, and a submodule's can exceed its parent's.
When compiled kernels fused from nodes of several modules were counted, a note
under the table (:func:`fused_note`) says how many and by which rule.

Example::

    >>> from opscope.analysis.modules import ModuleRow
    >>> rows = [ModuleRow("Net", "Net", "Net", 0, -1, count=1, parameters=10,
    ...                   forward_time_total=30.0, backward_time_total=50.0,
    ...                   self_forward_time_total=30.0, self_backward_time_total=50.0)]
    >>> print(format_module_table(rows).splitlines()[3][:63])
    Net                 1            10      30.000us      50.000us
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from opscope.arguments import check_bool, check_int, check_type
from opscope.analysis.modules import MEMORY_NOTE, fused_note
from opscope.export.table import (FLOP_RATE_UNITS, check_row_limit, check_sort_key,
                                  check_time_unit, flop_rate, flops_scale,
                                  format_memory, format_time, format_time_share)

SORT_KEYS = ("cpu_time_total", "self_cpu_time_total", "forward_time_total",
             "backward_time_total", "count", "parameters", "flops", "cpu_memory_usage",
             "self_cpu_memory_usage")
INDENT = "  "
COLUMN_GAP = 2
WIDTH = 12
# A long label is cut to (width - 6) characters + "...": below 7 none would be left.
MIN_NAME_WIDTH = 7


def _tree_order(rows: Sequence, sort_by: Optional[str]) -> List[int]:
    """Row indices depth first; siblings by first call, or by ``sort_by`` descending."""
    children: List[List[int]] = [[] for _ in rows]
    roots = []
    for i, row in enumerate(rows):
        (children[row.parent] if 0 <= row.parent < len(rows) else roots).append(i)

    def ordered(indices: List[int]) -> List[int]:
        if sort_by is None:
            return indices
        return sorted(indices, key=lambda i: getattr(rows[i], sort_by) or 0, reverse=True)

    out: List[int] = []
    stack = ordered(roots)[::-1]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(ordered(children[i])[::-1])
    return out


def _cell(text, width: int, align: str) -> str:
    return format(text, f"{align}{width}") + " " * COLUMN_GAP


def _titles(flops, rates, with_device: bool, with_memory: bool) -> List[str]:
    """The column titles after ``Module``."""
    titles = ["# of Calls", "Params", "Forward", "Backward", "Total", "Self", "Total %"]
    if flops:
        titles += [f"Total {flops[1]}", rates[1] if rates else "FLOP/s"]
    if with_device:
        titles += ["Self CUDA", "CUDA total"]
    if with_memory:
        titles += ["Net CPU Mem", "Self Net Mem"]
    return titles


def _cells(row, roots_total: float, time_unit: Optional[str], flops, rates, with_device: bool,
           with_memory: bool) -> list:
    """One row's cells after its label, in ``_titles`` order."""
    cells = [row.count, f"{row.parameters:,}",
             format_time(row.forward_time_total, time_unit),
             format_time(row.backward_time_total, time_unit),
             format_time(row.cpu_time_total, time_unit),
             format_time(row.self_cpu_time_total, time_unit),
             format_time_share(row.cpu_time_total, roots_total)]
    if flops:
        rate = flop_rate(row)
        cells += ["--" if row.flops <= 0 else f"{row.flops * flops[0]:8.3f}",
                  "--" if rate <= 0 or not rates else f"{rate * rates[0]:8.3f}"]
    if with_device:
        cells += [format_time(row.self_device_time_total or 0.0, time_unit),
                  format_time(row.device_time_total or 0.0, time_unit)]
    if with_memory:
        cells += [format_memory(row.cpu_memory_usage or 0),
                  format_memory(row.self_cpu_memory_usage or 0)]
    return cells


def format_module_table(rows: Sequence, *, sort_by: Optional[str] = None, row_limit: int = -1,
                        time_unit: Optional[str] = None, with_flops: bool = False,
                        max_name_column_width: int = 60, where: str = "module_table",
                        fused_kernels: Tuple[int, int] = (0, 0)) -> str:
    """Render module rows as an indented tree table ('' for no rows).

    ``sort_by`` (one of ``SORT_KEYS``) orders siblings, largest first; the tree
    shape is kept. ``row_limit`` caps the lines shown (-1: all, 0: none).
    ``where`` names the caller in argument errors. ``fused_kernels``, (calls,
    kernels) of ``analysis.modules.fused_kernel_counts``, adds :func:`fused_note`.

    >>> format_module_table([], row_limit=-2)
    Traceback (most recent call last):
    ...
    ValueError: module_table: row_limit must be >= -1, got -2
    """
    check_type("format_module_table", "where", where, str, "a str")
    check_sort_key(where, sort_by, SORT_KEYS, "a module table column")
    row_limit = check_row_limit(where, row_limit)
    check_time_unit(where, time_unit)
    with_flops = check_bool(where, "with_flops", with_flops)
    max_name_column_width = check_int(where, "max_name_column_width", max_name_column_width,
                                      minimum=MIN_NAME_WIDTH)
    try:
        rows = list(rows)
    except TypeError:
        raise TypeError(f"{where}: rows must be an iterable of module rows, "
                        f"got {type(rows).__name__}") from None
    if not rows:
        return ""
    order = _tree_order(rows, sort_by)
    labels = [INDENT * rows[i].depth + str(rows[i].key) for i in range(len(rows))]
    name_width = min(max(len(label) for label in labels) + 4, max_name_column_width)
    # from the largest, so the model's total reads as 6.624 GFLOPs, not 6624223.360 KFLOPs
    flops = flops_scale([r.flops for r in rows], from_largest=True) if with_flops else None
    rates = flops_scale([flop_rate(r) for r in rows], FLOP_RATE_UNITS,
                        from_largest=True) if flops else None
    with_memory = any(r.cpu_memory_usage is not None for r in rows)
    with_device = any(getattr(r, "device_time_total", None) is not None for r in rows)

    titles = _titles(flops, rates, with_device, with_memory)
    widths = [name_width] + [WIDTH] * len(titles)
    aligns = ["<"] + [">"] * len(titles)

    def line(cells) -> str:
        return "".join(_cell(c, w, a) for c, w, a in zip(cells, widths, aligns))

    rule = line(["-" * w for w in widths])
    roots_total = sum(r.cpu_time_total for r in rows if r.parent < 0)
    out = [rule, line(["Module"] + titles), rule]
    for shown, i in enumerate(order):
        if shown == row_limit:
            break
        row = rows[i]
        label = labels[i]
        if len(label) > name_width - 3:
            label = label[:name_width - 6] + "..."
        cells = [label] + _cells(row, roots_total, time_unit, flops, rates, with_device,
                                 with_memory)
        out.append(line(cells))
    out.append(rule)
    forward = sum(r.forward_time_total for r in rows if r.parent < 0)
    backward = sum(r.backward_time_total for r in rows if r.parent < 0)
    out.append(f"Module forward time total: {format_time(forward, time_unit)}")
    out.append(f"Module backward time total: {format_time(backward, time_unit)}")
    if with_memory:
        out.append(MEMORY_NOTE)
    if fused_note(*fused_kernels):
        out.append(fused_note(*fused_kernels))
    return "".join(text + "\n" for text in out)
