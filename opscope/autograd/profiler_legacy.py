"""``opscope.autograd.profile``: the deprecated legacy autograd profiler's API.

It mirrors ``torch.autograd.profiler_legacy.profile``: a context manager that
records everything in its block, then answers ``table()``,
``key_averages()``, ``total_average()``, ``self_cpu_time_total``,
``export_chrome_trace()`` (the legacy bare-array format) and
``export_stacks()``. It records through the same collector as
``opscope.profile`` (one ``opscope.profile`` runs underneath); new code
should use ``opscope.profile`` directly.

With ``profile_memory=True`` an allocation counts toward every range open on
its thread; one made with no range open is a top-level ``[memory]`` event.

Example::

    >>> import warnings, torch
    >>> from opscope.autograd import profile
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", FutureWarning)
    ...     prof = profile()
    >>> str(prof)
    '<unfinished opscope.autograd.profile>'
    >>> with prof:
    ...     _ = torch.ones(4) + 1
    >>> "aten::add" in [row.key for row in prof.key_averages()]
    True
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from opscope.model.torch_names import MEMORY_EVENT
from opscope.activity import ProfilerActivity
from opscope.analysis.function_events import function_events
from opscope.arguments import check_bool, check_choice, check_int, check_path
from opscope.autograd.legacy_export import (STACK_METRICS, write_legacy_stacks,
                                            write_legacy_trace)
from opscope.event_list import EventList

MEMORY_EVENT_NAME = MEMORY_EVENT
DEPRECATION = ("opscope.autograd.profile (torch.autograd.profiler_legacy.profile) is deprecated "
               "and will be removed; use opscope.profile instead, e.g. "
               "`with opscope.profile(record_shapes=True) as prof: ...`")


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


class profile:
    """DEPRECATED legacy profiler; use :class:`opscope.profile`.

    Arguments are those of ``torch.autograd.profiler_legacy.profile``.
    ``enabled=False`` makes it do nothing (``with`` then binds ``None``, as in
    torch). A profiler runs once: entering it again raises ``RuntimeError``.
    Every flag must be a bool (checked before anything else happens).

    >>> profile(record_shapes="yes")
    Traceback (most recent call last):
    ...
    TypeError: opscope.autograd.profile: record_shapes must be a bool, got str 'yes'
    """

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False,
                 record_shapes: bool = False, with_flops: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 with_modules: bool = False):
        where = "opscope.autograd.profile"
        flags = {name: check_bool(where, name, value) for name, value in (
            ("enabled", enabled), ("use_cuda", use_cuda), ("record_shapes", record_shapes),
            ("with_flops", with_flops), ("profile_memory", profile_memory),
            ("with_stack", with_stack), ("with_modules", with_modules))}
        warnings.warn(DEPRECATION, FutureWarning, stacklevel=2)
        self.enabled = flags["enabled"]
        self.function_events: Optional[EventList] = None
        self.entered = False
        self.use_cuda = flags["use_cuda"]
        self.with_flops = flags["with_flops"]
        self.record_shapes = flags["record_shapes"] or self.with_flops  # FLOPs need shapes
        self.profile_memory = flags["profile_memory"]
        self.with_stack = flags["with_stack"]
        self.with_modules = flags["with_modules"]
        self._profiler: Any = None
        if self.enabled and self.use_cuda and not _cuda_available():
            warnings.warn("CUDA is not available, disabling CUDA profiling", stacklevel=2)
            self.use_cuda = False

    # -- recording ----------------------------------------------------------------------
    def __enter__(self) -> Optional["profile"]:
        if not self.enabled:
            return None
        if self.entered:
            raise RuntimeError("Profiler context manager is not reentrant: this "
                               "opscope.autograd.profile already ran; create a new one")
        from opscope.api.profiler import profile as modern_profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.use_cuda else [])
        prof = modern_profile(activities=activities, record_shapes=self.record_shapes,
                              profile_memory=self.profile_memory, with_stack=self.with_stack,
                              with_flops=self.with_flops, with_modules=self.with_modules)
        prof.start()  # raises RuntimeError while another opscope profiler runs
        self.entered = True
        self._profiler = prof
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.enabled or self._profiler is None:
            return False
        prof, self._profiler = self._profiler, None
        prof.stop()
        self.function_events = EventList(_legacy_events(prof.session),
                                         profile_memory=self.profile_memory,
                                         with_flops=self.with_flops)
        return False

    # -- text -----------------------------------------------------------------------------
    def __repr__(self) -> str:
        if self.function_events is None:
            return ("<disabled opscope.autograd.profile>" if not self.enabled
                    else "<unfinished opscope.autograd.profile>")
        return repr(self.function_events)

    def __str__(self) -> str:
        if self.function_events is None:
            return repr(self)
        return str(self.function_events)

    def _finished(self) -> EventList:
        if self.function_events is None:
            if not self.enabled:
                raise RuntimeError("opscope.autograd.profile was created with enabled=False: "
                                   "nothing was recorded")
            raise RuntimeError("Profiler didn't finish running: results are available after "
                               "the `with opscope.autograd.profile(...)` block ends")
        return self.function_events

    # -- results --------------------------------------------------------------------------
    def table(self, sort_by=None, row_limit=100, max_src_column_width=75,
              max_name_column_width=55, max_shapes_column_width=80, header=None,
              top_level_events_only=False) -> str:
        """torch's text table of the recorded events (see ``EventList.table``).

        Arguments are checked before the profiler is asked for its results.
        """
        from opscope.export.table import check_table_arguments

        check_table_arguments(sort_by=sort_by, row_limit=row_limit,
                              max_src_column_width=max_src_column_width,
                              max_name_column_width=max_name_column_width,
                              max_shapes_column_width=max_shapes_column_width, header=header,
                              top_level_events_only=top_level_events_only)
        return self._finished().table(
            sort_by=sort_by, row_limit=row_limit, max_src_column_width=max_src_column_width,
            max_name_column_width=max_name_column_width,
            max_shapes_column_width=max_shapes_column_width, header=header,
            top_level_events_only=top_level_events_only)

    def export_chrome_trace(self, path) -> None:
        """Write the legacy Chrome trace: a bare JSON array of ``X`` events."""
        path = check_path("export_chrome_trace", "path", path)
        write_legacy_trace(self._finished(), path)

    def export_stacks(self, path, metric: str = "self_cpu_time_total") -> None:
        """Write one collapsed-stack line per event that has a Python stack."""
        path = check_path("export_stacks", "path", path)
        check_choice("export_stacks", "metric", metric, STACK_METRICS)
        events = self._finished()
        if not self.with_stack:
            raise RuntimeError("export_stacks() requires with_stack=True: create the profiler "
                               "as opscope.autograd.profile(with_stack=True)")
        write_legacy_stacks(events, path, metric)

    def key_averages(self, group_by_input_shape: bool = False,
                     group_by_stack_n: int = 0) -> EventList:
        """Events averaged by name (and optionally input shapes or top stack frames).

        Arguments are checked first: ``group_by_input_shape`` a bool,
        ``group_by_stack_n`` an int >= 0.
        """
        group_by_input_shape = check_bool("key_averages", "group_by_input_shape",
                                          group_by_input_shape)
        group_by_stack_n = check_int("key_averages", "group_by_stack_n", group_by_stack_n,
                                     minimum=0)
        return self._finished().key_averages(group_by_input_shape, group_by_stack_n)

    def total_average(self):
        """All events summed into one row with key ``"Total"``."""
        return self._finished().total_average()

    @property
    def self_cpu_time_total(self) -> float:
        """CPU time as the sum of self times across all events, in microseconds."""
        return self._finished().self_cpu_time_total


def _legacy_events(session) -> list:
    """The session's FunctionEvents, marked as legacy, in (start, -end) order."""
    events = function_events(session)
    for ev in events:
        ev.is_legacy = True
        if ev.name == MEMORY_EVENT_NAME:
            ev.trace_name = None  # as torch: not a timeline event
    events.sort(key=lambda ev: (ev.time_range.start, -ev.time_range.end))
    return events
