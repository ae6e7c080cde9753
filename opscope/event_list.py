"""EventList: the list that ``events()`` and ``key_averages()`` return.

It is a plain list of FunctionEvent / FunctionEventAvg with torch's methods:
``table()``, ``key_averages()``, ``total_average()``, ``self_cpu_time_total``
and, when pandas is installed, ``to_dataframe()``.

Example::

    >>> from opscope.model.function_event import FunctionEvent
    >>> events = EventList([FunctionEvent(id=1, name="aten::add", thread=1,
    ...                                   start_us=0.0, end_us=2.0)])
    >>> events.key_averages()[0].count, events.self_cpu_time_total
    (1, 2.0)
"""

from __future__ import annotations

from typing import Iterable, Tuple

from opscope.analysis.aggregate import event_key_averages, total_average
from opscope.arguments import check_bool, check_int
from opscope.model.function_event import FunctionEventAvg

DATAFRAME_COLUMNS = (
    "key", "count", "self_cpu_time_total", "cpu_time_total", "cpu_time",
    "cpu_memory_usage", "self_cpu_memory_usage", "flops", "input_shapes",
    "module_hierarchy",
)


class EventList(list):
    """A list of events or averages that can print itself as torch's table."""

    def __init__(self, events: Iterable = (), *, profile_memory: bool = False,
                 with_flops: bool = False, with_overload_name: bool = False):
        super().__init__(events)
        self._profile_memory = check_bool("EventList", "profile_memory", profile_memory)
        self._with_flops = check_bool("EventList", "with_flops", with_flops)
        self._with_overload_name = check_bool("EventList", "with_overload_name",
                                              with_overload_name)

    def table(self, sort_by=None, row_limit=100, max_src_column_width=75,
              max_name_column_width=55, max_shapes_column_width=80, header=None,
              top_level_events_only=False, time_unit=None) -> str:
        """torch.profiler's text table of these rows. See ``export.table.format_table``.

        Arguments are checked at the call, as torch names them: ``sort_by`` None
        or a sort key, ``row_limit`` >= -1 (-1: every row), widths ints,
        ``header`` None or a str, ``time_unit`` None, "s", "ms" or "us".

        >>> EventList([]).table(row_limit="all")
        Traceback (most recent call last):
        ...
        TypeError: table: row_limit must be an int, got str 'all'
        """
        from opscope.export.table import format_table

        return format_table(
            self, sort_by=sort_by, row_limit=row_limit,
            max_src_column_width=max_src_column_width,
            max_name_column_width=max_name_column_width,
            max_shapes_column_width=max_shapes_column_width, header=header,
            top_level_events_only=top_level_events_only, time_unit=time_unit,
            profile_memory=self._profile_memory, with_flops=self._with_flops,
            with_overload_name=self._with_overload_name, flop_rate_column=self._with_flops)

    def __str__(self) -> str:
        return self.table()

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False,
                     include_python_functions: bool = False) -> "EventList":
        """Group these events by key (and shapes, stack, overload name): see
        ``analysis.aggregate.event_key_averages``.

        Events with ``is_python_function`` set are left out unless
        ``include_python_functions`` is True, as in torch 2.15.

        >>> EventList([]).key_averages(group_by_stack_n=-1)
        Traceback (most recent call last):
        ...
        ValueError: key_averages: group_by_stack_n must be >= 0, got -1
        """
        group_by_input_shape = check_bool("key_averages", "group_by_input_shape",
                                          group_by_input_shape)
        group_by_stack_n = check_int("key_averages", "group_by_stack_n", group_by_stack_n,
                                     minimum=0)
        group_by_overload_name = check_bool("key_averages", "group_by_overload_name",
                                            group_by_overload_name)
        include_python_functions = check_bool("key_averages", "include_python_functions",
                                              include_python_functions)
        rows = event_key_averages(self, group_by_input_shape=group_by_input_shape,
                                  group_by_stack_n=group_by_stack_n,
                                  group_by_overload_name=group_by_overload_name,
                                  include_python_functions=include_python_functions)
        return EventList(rows, profile_memory=self._profile_memory, with_flops=self._with_flops,
                         with_overload_name=group_by_overload_name)

    def total_average(self) -> FunctionEventAvg:
        """All rows summed into one, with key "Total"."""
        return total_average(self)

    @property
    def self_cpu_time_total(self) -> float:
        """Sum of self CPU time over all rows, in microseconds."""
        return float(sum(ev.self_cpu_time_total for ev in self))

    def to_dataframe(self):
        """A pandas DataFrame, one row per event or average (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame([{c: getattr(ev, c, None) for c in DATAFRAME_COLUMNS}
                             for ev in self], columns=list(DATAFRAME_COLUMNS))


class ModuleList(list):
    """The rows of ``key_averages(group_by="module")``: one ``ModuleRow`` per module.

    Rows come parents first, each subtree together (see ``analysis.modules``);
    ``table()`` prints them as an indented tree. ``fused_kernels``, (calls, kernels)
    fused from nodes of several modules (``analysis.modules.fused_kernel_counts``),
    adds a note under it on how their time was counted.

    >>> ModuleList([]).table()
    ''
    """

    def __init__(self, rows: Iterable = (), *, with_flops: bool = False,
                 fused_kernels: Tuple[int, int] = (0, 0)):
        super().__init__(rows)
        self._with_flops = check_bool("ModuleList", "with_flops", with_flops)
        self.fused_kernels = tuple(fused_kernels)

    def table(self, sort_by=None, row_limit=-1, time_unit=None,
              max_name_column_width=60) -> str:
        """The module tree as text. See ``export.module_table.format_module_table``."""
        from opscope.export.module_table import format_module_table

        return format_module_table(self, sort_by=sort_by, row_limit=row_limit,
                                   time_unit=time_unit, with_flops=self._with_flops,
                                   max_name_column_width=max_name_column_width, where="table",
                                   fused_kernels=self.fused_kernels)

    def __str__(self) -> str:
        return self.table()
