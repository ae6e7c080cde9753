"""What a stopped ``opscope.profile`` offers: its session, tables and output files.

``ProfileResults`` is the part of ``opscope.profile`` that reads the last
finished window: ``session``, ``key_averages()``, ``module_table()``,
``memory_summary()``, and ``export()`` with its per-format spellings
(``export_chrome_trace`` ...), which all write through the registry of output
formats (``opscope.outputs``).

Example::

    >>> import os, tempfile, torch, opscope
    >>> with opscope.profile() as prof:
    ...     _ = torch.ones(2) * 2
    >>> path = os.path.join(tempfile.mkdtemp(), "run.stacks")
    >>> prof.export(path)          # the extension picks the format
    >>> os.path.exists(path)
    True
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from opscope.analysis.aggregate import event_key_averages, session_key_averages, total_average
from opscope.analysis.function_events import function_events
from opscope.arguments import check_bool, check_int, check_path
from opscope.event_list import EventList, ModuleList
from opscope.model.session import ProfileSession

class ProfileResults:
    """The results half of ``opscope.profile`` (a mixin: the profiler sets the state).

    It reads ``_session`` (the last window's session, or None), ``_events``
    (their FunctionEvents, built on first use), ``_recording`` and the
    option attributes (``profile_memory``, ``with_flops`` ...).
    """

    _session: Optional[ProfileSession]
    _earlier_sessions: Sequence[ProfileSession] = ()  # acc_events: windows before _session
    _events: Optional[EventList]
    _recording: bool
    profile_memory: bool
    with_flops: bool

    @property
    def session(self) -> ProfileSession:
        """The analysed session of the last finished active window."""
        if self._session is None:
            if self._recording:
                raise RuntimeError("opscope.profile: results are available after the profiler "
                                   "stops; leave the `with` block or call stop() first")
            raise RuntimeError("opscope.profile: no results: nothing was recorded yet (the "
                               "profiler never ran an active step)")
        return self._session

    def events(self) -> EventList:
        """Every recorded event as a FunctionEvent, sorted by start time."""
        if self._events is None:
            events = [e for s in self._sessions() for e in function_events(s)]
            self._events = EventList(events, profile_memory=self.profile_memory,
                                     with_flops=self.with_flops)
        return self._events

    def _sessions(self) -> List[ProfileSession]:
        """The sessions the results read: the last window's, after any earlier ones kept."""
        return list(self._earlier_sessions) + [self.session]

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False,
                     include_python_functions: bool = False, group_by: Optional[str] = None):
        """Events averaged by name (and optionally input shapes or the top of the stack).

        ``include_python_functions`` (torch 2.15's argument) also counts Python
        function events; opscope's collectors record none, so it changes nothing
        for a live recording. ``group_by="module"`` (with ``with_modules=True``)
        gives one row per ``nn.Module`` instead, as a tree: see ``module_table()``.
        """
        where = "key_averages"
        group_by_input_shape = check_bool(where, "group_by_input_shape", group_by_input_shape)
        group_by_stack_n = check_int(where, "group_by_stack_n", group_by_stack_n, minimum=0)
        group_by_overload_name = check_bool(where, "group_by_overload_name",
                                            group_by_overload_name)
        include_python_functions = check_bool(where, "include_python_functions",
                                              include_python_functions)
        if group_by is not None and not (isinstance(group_by, str) and group_by == "module"):
            raise ValueError(f"{where}: group_by must be None or 'module', got {group_by!r}")
        if group_by is not None:
            return self._module_averages(group_by)
        grouping = dict(group_by_input_shape=group_by_input_shape,
                        group_by_stack_n=group_by_stack_n,
                        group_by_overload_name=group_by_overload_name)
        sessions = self._sessions()
        rows = [row for s in sessions for row in session_key_averages(
            s, include_python_functions=include_python_functions, **grouping)]
        if len(sessions) > 1:  # acc_events: each cycle's rows, added up per key
            rows = event_key_averages(rows, include_python_functions=True, **grouping)
        return EventList(rows, profile_memory=self.profile_memory, with_flops=self.with_flops,
                         with_overload_name=group_by_overload_name)

    def _module_averages(self, group_by: str) -> ModuleList:
        if group_by != "module":
            raise ValueError(f"key_averages: group_by must be None or 'module', got {group_by!r}")
        session = self.session
        if session.modules is None:
            raise RuntimeError("key_averages(group_by='module') needs "
                               "opscope.profile(with_modules=True)")
        from opscope.analysis.modules import fused_kernel_counts, module_rows

        return ModuleList(module_rows(session), with_flops=self.with_flops,
                          fused_kernels=fused_kernel_counts(session))

    def module_table(self, sort_by: Optional[str] = None, row_limit: int = -1,
                     time_unit: Optional[str] = None, max_name_column_width: int = 60) -> str:
        """The module tree as text: one row per nn.Module (needs ``with_modules=True``).

        Same as ``key_averages(group_by="module").table(...)``.
        """
        return self.key_averages(group_by="module").table(
            sort_by=sort_by, row_limit=row_limit, time_unit=time_unit,
            max_name_column_width=max_name_column_width)

    def total_average(self):
        """All events summed into one row with key "Total" (summed from the columns)."""
        return total_average(self.key_averages())

    @property
    def self_cpu_time_total(self) -> float:
        """Total self CPU time of all events, in microseconds."""
        return float(self.session.table.self_ns.sum()) / 1000.0

    def memory_summary(self, top: int = 10) -> str:
        """Peak memory per step and the ops with the largest self allocations, as text."""
        top = check_int("memory_summary", "top", top, minimum=1)
        from opscope.export.memory_summary import format_memory_summary

        return format_memory_summary(self.session, top=top)

    # -- output files: each through opscope.outputs ------------------------------------
    def export(self, path: str, format: Optional[str] = None, **options: Any) -> None:
        """Write one output file; ``format`` names it, else ``path``'s extension picks it.

        ``format`` is a name of ``opscope.outputs.FORMATS``
        (``chrome_trace``, ``stacks``, ``report``, ``memory_timeline``), each
        also written by its own method (``fmt.method``: ``export_chrome_trace`` ...);
        ``options`` go to its writer (``metric=`` for stacks, ``device=`` for
        the memory timeline).
        """
        from opscope.outputs import format_for_path, get_format, missing_option

        if format is None:
            path = check_path("export", "path", path)
            fmt = format_for_path(path)
        else:
            fmt = get_format(format)
            path = check_path(fmt.method, "path", path)
        need = missing_option(fmt, {name: getattr(self, name) for name in fmt.needs})
        if need is not None:
            raise ValueError(f"{fmt.method} needs {need}=True: create "
                             f"the profiler with opscope.profile({need}=True, ...)")
        fmt.check(**options)
        fmt(self.session, path, **options)

    def export_chrome_trace(self, path: str) -> None:
        """Write the Chrome/Perfetto trace (gzipped when ``path`` ends in ``.gz``)."""
        self.export(path, format="chrome_trace")

    def export_memory_timeline(self, path: str, device: Optional[str] = None) -> None:
        """Write memory by category over time; the suffix of ``path`` picks the format.

        ``.json``/``.json.gz``: ``[times, sizes]``; ``.raw.json.gz``: raw rows;
        ``.html``: an offline plot. Needs only ``profile_memory=True``.
        """
        self.export(path, format="memory_timeline", device=device)

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total") -> None:
        """Write collapsed stacks for flamegraph.pl or speedscope."""
        self.export(path, format="stacks", metric=metric)

    def export_report(self, path: str) -> None:
        """Write the self-contained HTML report (overview, operators, flame graph, timeline...)."""
        self.export(path, format="report")

    def export_store(self, path: str) -> int:
        """Append the last finished window to the opscope store at ``path``; its window number.

        The store (a folder of Parquet files, see ``opscope.store``) is created
        when missing; each call adds a window (one the store already holds, as
        after ``store_handler(path)``, is not added again), under the rank of the
        session's ``distributedInfo`` (0 outside a distributed job). Query it
        with ``opscope query`` or ``opscope.store.connect``. Needs pyarrow
        (``pip install 'opscope[store]'``); a path that is not a store raises
        ``opscope.store.StoreError`` naming it.
        """
        from opscope.store.write import StoreWriter

        path = check_path("export_store", "path", path)
        session = self.session
        with StoreWriter(path) as writer:  # once: store_handler may have written it already
            return writer.write_window(session, once=True)
