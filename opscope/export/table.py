"""The text table of ``key_averages().table()``, laid out as torch.profiler 2.13 prints it.

``format_table`` takes rows (``FunctionEventAvg`` or ``FunctionEvent``) and returns the
table as one string, identical character for character to torch's, trailing spaces
included. The cells' units come from ``export/units.py`` and the argument checks from
``export/table_arguments.py``; both are re-exported here for the other tables.

Example::

    >>> from opscope.model.function_event import FunctionEventAvg
    >>> rows = [FunctionEventAvg("aten::mm", count=2, cpu_time_total=30.0,
    ...                          self_cpu_time_total=30.0)]
    >>> print(format_table(rows).replace("  \\n", "\\n"), end="")
    ------------  ------------  ------------  ------------  ------------  ------------  ------------
            Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg    # of Calls
    ------------  ------------  ------------  ------------  ------------  ------------  ------------
        aten::mm       100.00%      30.000us       100.00%      30.000us      15.000us             2
    ------------  ------------  ------------  ------------  ------------  ------------  ------------
    Self CPU time total: 30.000us
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

from opscope.arguments import check_bool
from opscope.export.table_arguments import (DEVICE_ALIASES, MIN_NAME_WIDTH,  # noqa: F401
                                            TIME_UNITS, check_row_limit, check_sort_key,
                                            check_table_arguments, check_time_unit,
                                            check_width, valid_sort_keys)
from opscope.export.units import (BYTES_PER_UNIT, FLOP_RATE_UNITS,  # noqa: F401
                                  FLOPS_HEADERS, US_PER_UNIT, flop_rate, flops_scale,
                                  format_memory, format_time, format_time_share)
from opscope.export.units import row_value as _attr

# Device types whose own rows hold kernel time (torch counts only those in the total).
DEVICE_KINDS = ("CUDA", "PrivateUse1", "MTIA", "XPU")
TOP_LEVEL_NOTE = "This report only display top-level ops statistics"
COLUMN_GAP = 2
DEFAULT_WIDTH = 12


def _sort_attribute(sort_by: str) -> str:
    for alias in DEVICE_ALIASES:
        sort_by = sort_by.replace(alias, "device")
    return sort_by


def _cap(width: int, limit: Optional[int]) -> int:
    return width if limit is None else min(width, limit)


def _shorten_name(name: str, limit: Optional[int]) -> str:
    # torch cuts at limit - 3 already, so a name of exactly that length gains "...".
    if limit is not None and len(name) >= limit - 3:
        return name[: limit - 3] + "..."
    return name


def _trim_path(path: str, width: int) -> str:
    """Keep the end of a long source path, marking the cut with "..."."""
    if len(path) > width:
        path = path[len(path) - width:]
        if len(path) > 3:
            path = "..." + path[3:]
    return path


def _flops_scale(events) -> Optional[Tuple[float, str]]:
    """(multiplier, header) picked from the smallest positive FLOP count, or None."""
    scale = flops_scale([_attr(e, "flops") for e in events])
    return None if scale is None else (scale[0], f"Total {scale[1]}")


def _device_average(evt) -> float:
    # computed here: the CPU-only model classes report a constant 0 for device_time
    count = _attr(evt, "count")
    return _attr(evt, "device_time_total") / count if count else 0.0


def _counts_device_time(evt) -> bool:
    kind = getattr(getattr(evt, "device_type", None), "name", "CPU")
    if kind == "CPU":
        return bool(getattr(evt, "is_legacy", False))  # legacy kept kernels on CPU rows
    return kind in DEVICE_KINDS and not getattr(evt, "is_user_annotation", False)


class _Layout:
    """Column titles, widths and alignments, plus the formats derived from them."""

    def __init__(self):
        self.titles: List[str] = []
        self.widths: List[int] = []
        self.aligns: List[str] = []

    def add(self, title: str, width: int = DEFAULT_WIDTH, align: str = ">") -> None:
        self.titles.append(title)
        self.widths.append(width)
        self.aligns.append(align)

    def line(self, cells: Sequence) -> str:
        gap = " " * COLUMN_GAP
        return "".join(format(c, f"{a}{w}") + gap
                       for c, w, a in zip(cells, self.widths, self.aligns))

    def rule(self) -> str:
        return self.line(["-" * w for w in self.widths])

    def total_width(self) -> int:
        return sum(self.widths) + COLUMN_GAP * (len(self.widths) - 1)


def format_table(events, *, sort_by=None, row_limit=100, max_src_column_width=75,
                 max_name_column_width=55, max_shapes_column_width=80, header=None,
                 top_level_events_only=False, time_unit=None, profile_memory=False,
                 with_flops=False, with_overload_name=False, flop_rate_column=False) -> str:
    """Render rows as torch.profiler's summary table.

    Rows are sorted descending by ``sort_by`` (see ``valid_sort_keys``; ``cuda``, ``xpu``
    and ``privateuse1`` names read the ``device`` attributes) or kept in order when it is
    None. At most ``row_limit`` rows are shown (-1: all); percentages are shares of the
    self CPU time of every row passed in. Optional columns appear when the rows carry
    the data: device times, input shapes, source stacks, overload names
    (``with_overload_name``), memory (``profile_memory``) and FLOPs (``with_flops``).
    ``flop_rate_column`` (opscope's, not torch's) adds achieved FLOP/s per row after
    ``# of Calls`` when FLOPs are shown.

    >>> from opscope.model.function_event import FunctionEventAvg
    >>> rows = [FunctionEventAvg("a", count=1, cpu_time_total=1.0, self_cpu_time_total=1.0)]
    >>> format_table(rows, sort_by="cpu_time_total", time_unit="ms").splitlines()[-1]
    'Self CPU time total: 0.001ms'
    >>> format_table(rows, sort_by="speed")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: table: sort_by='speed' is not a sortable attribute; expected one of: cpu_time, ...
    >>> format_table(rows, max_name_column_width=-3)
    Traceback (most recent call last):
    ...
    ValueError: table: max_name_column_width must be >= 4, got -3
    """
    check_table_arguments(sort_by=sort_by, row_limit=row_limit,
                          max_src_column_width=max_src_column_width,
                          max_name_column_width=max_name_column_width,
                          max_shapes_column_width=max_shapes_column_width, header=header,
                          top_level_events_only=top_level_events_only, time_unit=time_unit)
    for flag, value in (("profile_memory", profile_memory), ("with_flops", with_flops),
                        ("with_overload_name", with_overload_name),
                        ("flop_rate_column", flop_rate_column)):
        check_bool("table", flag, value)
    events = _sorted_rows(events, sort_by)
    if not events:
        return ""
    columns = _plan_columns(events, max_src_column_width, max_name_column_width,
                            max_shapes_column_width, time_unit, profile_memory, with_flops,
                            with_overload_name, flop_rate_column)
    layout = _layout(columns)
    lines = []
    if header is not None:
        lines += ["=" * layout.total_width(), header]
    if top_level_events_only:
        lines += ["=" * layout.total_width(), TOP_LEVEL_NOTE]
    lines += [layout.rule(), layout.line(layout.titles), layout.rule()]
    shown, row_limit = 0, int(row_limit)
    for evt in events:
        if shown == row_limit:
            break
        if top_level_events_only and getattr(evt, "cpu_parent", None) is not None:
            continue
        shown += 1
        lines += _row_lines(evt, columns, layout)
    lines.append(layout.rule())
    lines.append(f"Self CPU time total: {format_time(columns.total_cpu, time_unit)}")
    if columns.has_device_time:
        lines.append(f"Self {columns.device} time total: "
                     f"{format_time(columns.total_device, time_unit)}")
    return "".join(line + "\n" for line in lines)


def _sorted_rows(events, sort_by: Optional[str]) -> list:
    """The rows as a list, sorted descending by ``sort_by`` when it is given."""
    try:
        events = list(events)
    except TypeError:
        raise TypeError(f"table: events must be an iterable of events or rows, "
                        f"got {type(events).__name__}") from None
    if sort_by is not None:
        attribute = _sort_attribute(sort_by)
        events = sorted(events, key=lambda e: _attr(e, attribute), reverse=True)
    return events


class _Columns(NamedTuple):
    """Which optional columns the rows fill, their widths and scales, and the totals."""

    device: str
    has_device_time: bool
    profile_memory: bool
    device_memory: bool
    show_overload: bool
    show_node_id: bool
    name_width: int
    name_limit: Optional[int]
    shapes_width: Optional[int]
    src_width: Optional[int]  # None: no row has a stack
    flops: Optional[Tuple[float, str]]
    rates: Optional[Tuple[float, str]]
    time_unit: Optional[str]
    total_cpu: float
    total_device: float


def _plan_columns(events, max_src_column_width, max_name_column_width,
                  max_shapes_column_width, time_unit, profile_memory, with_flops,
                  with_overload_name, flop_rate_column) -> _Columns:
    use_device = getattr(events[0], "use_device", None)
    has_device_time = any(_attr(e, "self_device_time_total") > 0 for e in events)
    if has_device_time and not use_device:
        raise RuntimeError("rows carry device time but their use_device is None; "
                           "set use_device to the device name (e.g. 'cuda')")
    shapes_width = src_width = None
    if any(e.input_shapes is not None and len(e.input_shapes) > 0 for e in events):
        shapes_width = _cap(max(len(str(e.input_shapes)) for e in events) + 4,
                            max_shapes_column_width)
    stacks = [e.stack for e in events if e.stack]
    if stacks:
        src_width = _cap(max(len(entry) for stack in stacks for entry in stack) + 4,
                         max_src_column_width)
    flops = _flops_scale(events) if with_flops else None
    rates = flops_scale([flop_rate(e) for e in events], FLOP_RATE_UNITS) \
        if flops is not None and flop_rate_column else None
    return _Columns(
        device=use_device.upper() if use_device else "None",
        has_device_time=has_device_time,
        profile_memory=profile_memory,
        device_memory=bool(profile_memory and use_device
                           and any(_attr(e, "self_device_memory_usage") > 0 for e in events)),
        show_overload=with_overload_name and any(_attr(e, "overload_name", "") for e in events),
        show_node_id=any(_attr(e, "node_id", -1) != -1 for e in events),
        name_width=_cap(max(len(str(e.key)) for e in events) + 4, max_name_column_width),
        name_limit=max_name_column_width, shapes_width=shapes_width, src_width=src_width,
        flops=flops, rates=rates, time_unit=time_unit,
        total_cpu=sum(e.self_cpu_time_total for e in events),
        total_device=sum(_attr(e, "self_device_time_total") for e in events
                         if _counts_device_time(e)))


def _layout(columns: _Columns) -> _Layout:
    layout = _Layout()
    layout.add("Name", columns.name_width)
    if columns.show_overload:
        layout.add("Overload Name", columns.name_width)
    for title in ("Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"):
        layout.add(title)
    if columns.has_device_time:
        for title in ("Self {}", "Self {} %", "{} total", "{} time avg"):
            layout.add(title.format(columns.device))
    if columns.profile_memory:
        layout.add("CPU Mem")
        layout.add("Self CPU Mem")
        if columns.device_memory:
            layout.add(f"{columns.device} Mem")
            layout.add(f"Self {columns.device} Mem")
    layout.add("# of Calls")
    if columns.show_node_id:
        layout.add("Node ID")
    if columns.rates is not None:
        layout.add(columns.rates[1])
    if columns.shapes_width is not None:
        layout.add("Input Shapes", columns.shapes_width)
    if columns.flops is not None:
        layout.add(columns.flops[1])
    if columns.src_width is not None:  # last, so a stack's further frames line up under it
        layout.add("Source Location", columns.src_width, "<")
    return layout


def _time_cells(evt, columns: _Columns) -> list:
    unit, total_cpu = columns.time_unit, columns.total_cpu
    cells = [
        format_time_share(evt.self_cpu_time_total, total_cpu),
        format_time(evt.self_cpu_time_total, unit),
        0 if evt.is_async else format_time_share(evt.cpu_time_total, total_cpu),
        format_time(evt.cpu_time_total, unit),
        format_time(evt.cpu_time, unit),
    ]
    if columns.has_device_time:
        cells += [format_time(_attr(evt, "self_device_time_total"), unit),
                  format_time_share(_attr(evt, "self_device_time_total"), columns.total_device),
                  format_time(_attr(evt, "device_time_total"), unit),
                  format_time(_device_average(evt), unit)]
    if columns.profile_memory:
        cells += [format_memory(evt.cpu_memory_usage), format_memory(evt.self_cpu_memory_usage)]
        if columns.device_memory:
            cells += [format_memory(_attr(evt, "device_memory_usage")),
                      format_memory(_attr(evt, "self_device_memory_usage"))]
    return cells


def _row_lines(evt, columns: _Columns, layout: _Layout) -> List[str]:
    """The row's line, then (with stacks) one line per further frame and a blank line."""
    cells = [_shorten_name(str(evt.key), columns.name_limit)]
    if columns.show_overload:
        cells.append(_shorten_name(evt.overload_name or "", columns.name_limit))
    cells += _time_cells(evt, columns)
    cells.append(evt.count)
    if columns.show_node_id:
        cells.append(evt.node_id)
    if columns.rates is not None:
        rate = flop_rate(evt)
        cells.append("--" if rate <= 0 else f"{rate * columns.rates[0]:8.3f}")
    if columns.shapes_width is not None:
        cells.append(str(evt.input_shapes)[:columns.shapes_width])
    # torch 2.13 titles "Source Location" before the FLOPs column but fills the FLOPs
    # cell first, so its titles and values are swapped; here both follow this order.
    if columns.flops is not None:
        count = _attr(evt, "flops")
        cells.append("--" if count <= 0 else f"{count * columns.flops[0]:8.3f}")
    width = columns.src_width
    if width is None:
        return [layout.line(cells)]
    cells.append(_trim_path(evt.stack[0], width) if evt.stack else "")
    blanks = [""] * (len(layout.titles) - 1)
    return ([layout.line(cells)]
            + [layout.line(blanks + [_trim_path(entry, width)]) for entry in (evt.stack or [])[1:]]
            + [layout.line(blanks + [""])])
