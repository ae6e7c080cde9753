"""The checks of ``table()``'s arguments, as torch names them: each error names the bad one.

>>> check_table_arguments(row_limit=-1, sort_by="self_cpu_time_total", time_unit="ms")
>>> check_row_limit("table", -2)
Traceback (most recent call last):
...
ValueError: table: row_limit must be >= -1, got -2
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from opscope.arguments import check_bool, check_choice, check_int, check_type

DEVICE_ALIASES = ("cuda", "xpu", "privateuse1")
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
    """``time_unit``: None (each cell picks its unit) or one of 's', 'ms', 'us'.

    >>> check_time_unit("table", "ms")
    'ms'
    """
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
