"""The text table of ``key_averages().table()``, laid out as torch.profiler 2.13 prints it.

``format_table`` takes rows (``FunctionEventAvg`` or ``FunctionEvent``) and returns the
table as one string, identical character for character to torch's, trailing spaces
included. The unit formatters are public because other reports reuse them.

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

import math
from typing import Any, List, Optional, Sequence, Tuple

from opscope.arguments import check_bool, check_choice, check_int, check_type

US_PER_UNIT = {"s": 1_000_000.0, "ms": 1_000.0, "us": 1.0}
BYTES_PER_UNIT = (("GB", 1024 ** 3), ("MB", 1024 ** 2), ("KB", 1024))
FLOPS_HEADERS = ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs")
FLOP_RATE_UNITS = ("FLOP/s", "KFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s")
DEVICE_ALIASES = ("cuda", "xpu", "privateuse1")
# Device types whose own rows hold kernel time (torch counts only those in the total).
DEVICE_KINDS = ("CUDA", "PrivateUse1", "MTIA", "XPU")
TOP_LEVEL_NOTE = "This report only display top-level ops statistics"
COLUMN_GAP = 2
DEFAULT_WIDTH = 12
TIME_UNITS = (None, "s", "ms", "us")
# A name is cut to (width - 3) characters + "...": below 4 no character would be left.
MIN_NAME_WIDTH = 4


def valid_sort_keys() -> Tuple[str, ...]:
    """Every ``sort_by`` value ``format_table`` accepts.

    >>> "self_cpu_time_total" in valid_sort_keys(), "flops" in valid_sort_keys()
    (True, True)
    """
    keys = []
    for dev in ("cpu", "device") + DEVICE_ALIASES:
        keys += [f"{dev}_time", f"{dev}_time_total", f"self_{dev}_time_total",
                 f"{dev}_memory_usage", f"self_{dev}_memory_usage"]
    return tuple(keys) + ("count", "flops")


def format_time(time_us: float, unit: Optional[str] = None) -> str:
    """Microseconds as text with 3 decimals, in ``unit`` or the largest unit reached.

    >>> format_time(125.0444), format_time(1642.58), format_time(2.5e6), format_time(5.0, "ms")
    ('125.044us', '1.643ms', '2.500s', '0.005ms')
    """
    if unit is None:
        unit = "s" if time_us >= US_PER_UNIT["s"] else "ms" if time_us >= US_PER_UNIT["ms"] else "us"
    if unit not in US_PER_UNIT:
        raise ValueError(f"time_unit must be one of None, 's', 'ms', 'us'; got {unit!r}")
    return f"{time_us / US_PER_UNIT[unit]:.3f}{unit}"


def format_time_share(time_us: float, total_us: float) -> str:
    """``time_us`` as a percentage of ``total_us``; ``"NaN"`` when the total is zero.

    >>> format_time_share(125.044, 1972.525), format_time_share(-32.473, 1972.525)
    ('6.34%', '-1.65%')
    >>> format_time_share(0.0, 0.0)
    'NaN'
    """
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def format_memory(nbytes: int) -> str:
    """Bytes as text in base-1024 units, two decimals above 1 KB.

    >>> format_memory(0), format_memory(-38440), format_memory(3 * 1024 ** 3)
    ('0 B', '-37.54 KB', '3.00 GB')
    """
    for unit, size in BYTES_PER_UNIT:
        if abs(nbytes) >= size:
            return f"{nbytes * 1.0 / size:.2f} {unit}"
    return f"{nbytes} B"


def _attr(evt, name: str, default=0):
    value = getattr(evt, name, default)
    return default if value is None else value


def check_sort_key(where: str, sort_by: Any, keys: Sequence[str], what: str) -> Optional[str]:
    """``sort_by`` when it is None or one of ``keys``; else an error listing them.

    >>> check_sort_key("table", "speed", ("count",), "a sortable attribute")
    Traceback (most recent call last):
    ...
    ValueError: table: sort_by='speed' is not a sortable attribute; expected one of: count
    """
    if sort_by is None:
        return None
    check_type(where, "sort_by", sort_by, str, "a str or None")
    if sort_by not in keys:
        raise ValueError(f"{where}: sort_by={sort_by!r} is not {what}; "
                         f"expected one of: {', '.join(keys)}")
    return sort_by


def check_width(where: str, name: str, value: Any, minimum: int = 1) -> Optional[int]:
    """A column width: None (no limit) or an int >= ``minimum``.

    >>> check_width("table", "max_name_column_width", -3, minimum=4)
    Traceback (most recent call last):
    ...
    ValueError: table: max_name_column_width must be >= 4, got -3
    """
    return None if value is None else check_int(where, name, value, minimum=minimum)


def check_row_limit(where: str, row_limit: Any) -> int:
    """``row_limit`` as torch reads it: -1 shows every row, 0 none, n at most n.

    >>> check_row_limit("table", -2)
    Traceback (most recent call last):
    ...
    ValueError: table: row_limit must be >= -1, got -2
    """
    return check_int(where, "row_limit", row_limit, minimum=-1)


def check_time_unit(where: str, time_unit: Any) -> Optional[str]:
    """``time_unit``: None (each cell picks its unit) or one of 's', 'ms', 'us'."""
    return check_choice(where, "time_unit", time_unit, TIME_UNITS)


def check_table_arguments(*, sort_by=None, row_limit=100, max_src_column_width=75,
                          max_name_column_width=55, max_shapes_column_width=80, header=None,
                          top_level_events_only=False, time_unit=None,
                          where: str = "table") -> None:
    """Check the arguments of ``table()`` as torch names them; raise naming the bad one.

    ``sort_by`` None or one of ``valid_sort_keys()``; ``row_limit`` an int >= -1;
    widths None or ints (names need ``MIN_NAME_WIDTH``); ``header`` None or a str;
    ``top_level_events_only`` a bool; ``time_unit`` one of ``TIME_UNITS``.

    >>> check_table_arguments(row_limit=-1, sort_by="self_cpu_time_total", time_unit="ms")
    >>> check_table_arguments(header=3)
    Traceback (most recent call last):
    ...
    TypeError: table: header must be a str or None, got int 3
    """
    check_sort_key(where, sort_by, valid_sort_keys(), "a sortable attribute")
    check_row_limit(where, row_limit)
    check_width(where, "max_src_column_width", max_src_column_width)
    check_width(where, "max_name_column_width", max_name_column_width, MIN_NAME_WIDTH)
    check_width(where, "max_shapes_column_width", max_shapes_column_width)
    if header is not None:
        check_type(where, "header", header, str, "a str or None")
    check_bool(where, "top_level_events_only", top_level_events_only)
    check_time_unit(where, time_unit)


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


def flops_scale(values, units: Sequence[str] = FLOPS_HEADERS) -> Optional[Tuple[float, str]]:
    """(multiplier, unit) for FLOP counts, picked as torch does from the smallest positive.

    >>> flops_scale([2_500, 5_000_000, 0])
    (0.001, 'KFLOPs')
    >>> flops_scale([3e9], FLOP_RATE_UNITS), flops_scale([0])
    ((1e-09, 'GFLOP/s'), None)
    """
    positive = [v for v in values if v > 0]
    if not positive:
        return None
    level = int(max(0.0, min(math.log10(min(positive)) / 3, len(units) - 1.0)))
    return pow(10, level * -3.0), units[level]


def flop_rate(evt) -> float:
    """Achieved FLOP/s of a row: its FLOPs over its CPU total time (0 without either).

    >>> from opscope.model.function_event import FunctionEventAvg
    >>> flop_rate(FunctionEventAvg("aten::mm", cpu_time_total=2.0, flops=4_000))
    2000000000.0
    """
    seconds = _attr(evt, "cpu_time_total") / US_PER_UNIT["s"]
    count = _attr(evt, "flops")
    return count / seconds if count > 0 and seconds > 0 else 0.0


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
    row_limit = int(row_limit)
    try:
        events = list(events)
    except TypeError:
        raise TypeError(f"table: events must be an iterable of events or rows, "
                        f"got {type(events).__name__}") from None
    if sort_by is not None:
        attribute = _sort_attribute(sort_by)
        events = sorted(events, key=lambda e: _attr(e, attribute), reverse=True)
    if not events:
        return ""

    use_device = getattr(events[0], "use_device", None)
    has_device_time = any(_attr(e, "self_device_time_total") > 0 for e in events)
    has_device_mem = any(_attr(e, "self_device_memory_usage") > 0 for e in events)
    if has_device_time and not use_device:
        raise RuntimeError("rows carry device time but their use_device is None; "
                           "set use_device to the device name (e.g. 'cuda')")
    show_overload = with_overload_name and any(_attr(e, "overload_name", "") for e in events)
    show_shapes = any(e.input_shapes is not None and len(e.input_shapes) > 0 for e in events)
    stacks = [e.stack for e in events if e.stack]
    show_node_id = any(_attr(e, "node_id", -1) != -1 for e in events)
    flops = _flops_scale(events) if with_flops else None
    rates = flops_scale([flop_rate(e) for e in events], FLOP_RATE_UNITS) \
        if flops is not None and flop_rate_column else None
    device = use_device.upper() if use_device else "None"

    name_width = _cap(max(len(str(e.key)) for e in events) + 4, max_name_column_width)
    layout = _Layout()
    layout.add("Name", name_width)
    if show_overload:
        layout.add("Overload Name", name_width)
    for title in ("Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"):
        layout.add(title)
    if has_device_time:
        for title in ("Self {}", "Self {} %", "{} total", "{} time avg"):
            layout.add(title.format(device))
    if profile_memory:
        layout.add("CPU Mem")
        layout.add("Self CPU Mem")
        if use_device and has_device_mem:
            layout.add(f"{device} Mem")
            layout.add(f"Self {device} Mem")
    layout.add("# of Calls")
    if show_node_id:
        layout.add("Node ID")
    if rates is not None:
        layout.add(rates[1])
    if show_shapes:
        shapes_width = max(len(str(e.input_shapes)) for e in events) + 4
        shapes_width = _cap(shapes_width, max_shapes_column_width)
        layout.add("Input Shapes", shapes_width)
    if stacks:
        src_width = max(len(entry) for stack in stacks for entry in stack) + 4
        src_width = _cap(src_width, max_src_column_width)
        layout.add("Source Location", src_width, "<")
    if flops is not None:
        layout.add(flops[1])

    total_cpu = sum(e.self_cpu_time_total for e in events)
    total_device = sum(_attr(e, "self_device_time_total") for e in events
                       if _counts_device_time(e))
    lines = []
    if header is not None:
        lines += ["=" * layout.total_width(), header]
    if top_level_events_only:
        lines += ["=" * layout.total_width(), TOP_LEVEL_NOTE]
    lines += [layout.rule(), layout.line(layout.titles), layout.rule()]

    shown = 0
    for evt in events:
        if shown == row_limit:
            break
        if top_level_events_only and getattr(evt, "cpu_parent", None) is not None:
            continue
        shown += 1
        cells = [_shorten_name(str(evt.key), max_name_column_width)]
        if show_overload:
            cells.append(_shorten_name(evt.overload_name or "", max_name_column_width))
        cells += [
            format_time_share(evt.self_cpu_time_total, total_cpu),
            format_time(evt.self_cpu_time_total, time_unit),
            0 if evt.is_async else format_time_share(evt.cpu_time_total, total_cpu),
            format_time(evt.cpu_time_total, time_unit),
            format_time(evt.cpu_time, time_unit),
        ]
        if has_device_time:
            cells += [format_time(_attr(evt, "self_device_time_total"), time_unit),
                      format_time_share(_attr(evt, "self_device_time_total"), total_device),
                      format_time(_attr(evt, "device_time_total"), time_unit),
                      format_time(_device_average(evt), time_unit)]
        if profile_memory:
            cells += [format_memory(evt.cpu_memory_usage),
                      format_memory(evt.self_cpu_memory_usage)]
            if use_device and has_device_mem:
                cells += [format_memory(_attr(evt, "device_memory_usage")),
                          format_memory(_attr(evt, "self_device_memory_usage"))]
        cells.append(evt.count)
        if show_node_id:
            cells.append(evt.node_id)
        if rates is not None:
            rate = flop_rate(evt)
            cells.append("--" if rate <= 0 else f"{rate * rates[0]:8.3f}")
        if show_shapes:
            cells.append(str(evt.input_shapes)[:shapes_width])
        # torch fills the FLOPs cell before the source cell although the headers put
        # "Source Location" first; keeping that order keeps its output byte-identical.
        if flops is not None:
            count = _attr(evt, "flops")
            cells.append("--" if count <= 0 else f"{count * flops[0]:8.3f}")
        if stacks:
            cells.append(_trim_path(evt.stack[0], src_width) if evt.stack else "")
        lines.append(layout.line(cells))
        if stacks:
            blanks = [""] * (len(layout.titles) - 1)
            lines += [layout.line(blanks + [_trim_path(entry, src_width)])
                      for entry in (evt.stack or [])[1:]]
            lines.append(layout.line(blanks + [""]))

    lines.append(layout.rule())
    lines.append(f"Self CPU time total: {format_time(total_cpu, time_unit)}")
    if has_device_time:
        lines.append(f"Self {device} time total: {format_time(total_device, time_unit)}")
    return "".join(line + "\n" for line in lines)
