"""``opscope.profile``: the torch.profiler API, conducting our collector.

This module owns the schedule state machine and wires a collector to the
model. It formats nothing itself: tables, traces and stacks live in
``opscope.export``.

Example::

    >>> import torch, opscope
    >>> with opscope.profile() as prof:
    ...     _ = torch.ones(4) + 1
    >>> "aten::add" in [row.key for row in prof.key_averages()]
    True
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from typing import Any, Callable, Dict, Iterable, Optional

from opscope.model.torch_names import PROFILER_STEP
from opscope.activity import resolve_activity_configs
from opscope.arguments import check_bool, check_callable, check_int, check_name
from opscope.arguments import check_path
from opscope.analysis.aggregate import session_key_averages
from opscope.analysis.aggregate import total_average
from opscope.analysis.build import build_session
from opscope.analysis.function_events import function_events
from opscope.collect.profiler_flag import TORCH_FLAG
from opscope.configs import CONFIGS_METADATA_KEY, unapplied_configs_metadata
from opscope.event_list import EventList, ModuleList
from opscope.itt import take_marks
from opscope.model.session import OPTION_NAMES, ProfileSession
from opscope.record_function import record_function, set_recording_collector
from opscope.schedule import TRANSITIONS, ProfilerAction, as_action, default_schedule
from opscope.step_tracker import StepTracker

PROFILER_STEP_NAME = PROFILER_STEP

_active_lock = threading.Lock()
_active: Optional["profile"] = None


def _claim(prof: "profile") -> None:
    global _active
    with _active_lock:
        if _active is not None and _active is not prof:
            raise RuntimeError(
                "opscope.profile is not reentrant: another profiler is already running "
                "in this process; stop it before starting a new one")
        _active = prof


def _release(prof: "profile") -> None:
    global _active
    with _active_lock:
        if _active is prof:
            _active = None


def _forget_parent_profiler() -> None:
    """In a forked child: stop recording into the parent's copy and free it.

    Runs right after ``os.fork()`` (and multiprocessing's fork start method),
    when the child has a single thread. A lock another parent thread held at
    the fork stays locked forever in the child, so the lock is replaced, not
    taken. The child can then start a profiler of its own.
    """
    global _active, _active_lock
    _active_lock = threading.Lock()
    prof, _active = _active, None
    set_recording_collector(None)
    TORCH_FLAG.lower_flag()  # the child records nothing of the parent's
    if prof is not None:
        try:
            prof._detach_after_fork()
        except Exception as e:  # never break the child over a recording it does not own
            warnings.warn(f"opscope: could not drop the parent's recording after fork: {e}",
                          RuntimeWarning)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_profiler)


def _check_optional(name: str, value: Any, cls: type, expected: str) -> Any:
    """``value`` when it is None or a ``cls``; else TypeError naming ``name``."""
    if value is not None and not isinstance(value, cls):
        raise TypeError(f"profile: {name} must be {expected} or None, got "
                        f"{type(value).__name__} {value!r:.60}")
    return value


def _validate_json(key: str, value: str) -> str:
    """Fail where bad metadata is given, not later at export."""
    from opscope.export.chrome_trace import validate_metadata_json

    validate_metadata_json(key, value)
    return value


class profile:
    """Profile the code in a ``with`` block, or between ``start()`` and ``stop()``.

    Arguments and behaviour follow ``torch.profiler.profile``. With a
    ``schedule``, call ``step()`` once per iteration; each active cycle ends
    by calling ``on_trace_ready(prof)``. ``activities`` may hold torch 2.15's
    ``{ProfilerActivity.CUDA: ProfilerActivityConfig(...)}`` dicts on any torch;
    configs opscope does not apply are kept in the trace metadata.

    >>> import opscope
    >>> sched = opscope.schedule(wait=1, warmup=1, active=1)
    >>> with opscope.profile(schedule=sched) as p:
    ...     for _ in range(3):
    ...         p.step()
    >>> p.step_num
    3

    Faults keep what was recorded: a failing ``on_trace_ready`` or execution
    trace raises after the session is built, and ``key_averages()`` and the
    exports still work. After ``os.fork()`` the child records nothing into its
    copy of the parent's profile (it is freed) and may start its own profiler.
    """

    def __init__(self, *, activities: Optional[Iterable[Any]] = None,
                 schedule: Optional[Callable[[int], Any]] = None,
                 on_trace_ready: Optional[Callable[..., Any]] = None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Any = None,
                 execution_trace_observer: Any = None, use_cuda: Optional[bool] = None):
        # torch 2.15's dict items ({activity: ProfilerActivityConfig}) give the configs
        self.activities, self.activity_configs = resolve_activity_configs(activities, use_cuda)
        self._configs_metadata = unapplied_configs_metadata("profile", self.activity_configs)
        check_callable("profile", "schedule", schedule)
        check_callable("profile", "on_trace_ready", on_trace_ready)
        self.record_shapes = check_bool("profile", "record_shapes", record_shapes)
        self.profile_memory = check_bool("profile", "profile_memory", profile_memory)
        self.with_stack = check_bool("profile", "with_stack", with_stack)
        self.with_flops = check_bool("profile", "with_flops", with_flops)
        self.with_modules = check_bool("profile", "with_modules", with_modules)
        from torch._C._profiler import _ExperimentalConfig

        from opscope.execution_trace import ExecutionTraceObserver

        self.experimental_config = _check_optional(
            "experimental_config", experimental_config, _ExperimentalConfig,
            "a torch.profiler._ExperimentalConfig")
        self.execution_trace_observer = _check_optional(
            "execution_trace_observer", execution_trace_observer, ExecutionTraceObserver,
            "an opscope.ExecutionTraceObserver")
        self.record_steps = schedule is not None
        self.schedule = schedule if schedule is not None else default_schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.current_action = as_action(self.schedule(self.step_num))
        self.preset_metadata: Dict[str, str] = {}
        self._collector: Any = None
        self._recording = False
        self._metadata: Dict[str, str] = {}
        self._session: Optional[ProfileSession] = None
        self._events: Optional[EventList] = None
        self._step_range: Optional[record_function] = None
        self._sightings: Any = None  # memory-category hooks while recording
        self._module_ranges: Any = None  # collect.module_hooks.ModuleRanges while recording
        self._started = False  # between start() and stop()
        self._owner_pid = os.getpid()  # a forked child never drives its parent's profiler

    # -- context manager and schedule -------------------------------------------------
    def __enter__(self) -> "profile":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._owner_pid != os.getpid():
            return  # a forked child leaving its parent's block: nothing here is its own
        try:
            self.stop()
        finally:
            if self.execution_trace_observer is not None:
                self.execution_trace_observer.cleanup()

    def start(self) -> None:
        """Begin profiling (the first step's action decides whether to record).

        Raises RuntimeError when this profiler is already started; the running
        recording goes on untouched.
        """
        if self._started:
            raise RuntimeError("opscope.profile.start: this profiler is already running; "
                               "call stop() before starting it again")
        _claim(self)
        self._started = True
        self._owner_pid = os.getpid()
        StepTracker.init_step_count(PROFILER_STEP_NAME)
        try:
            self._transit(ProfilerAction.NONE, self.current_action)
            self._enter_step_range()
        except BaseException:
            self._abort()
            raise

    def stop(self) -> None:
        """End profiling; results of the last active window become available.

        If writing an output fails (the execution trace, ``on_trace_ready``),
        the session is built first and kept, every hook is removed, and then
        the error is raised. In a forked child, stop() leaves the parent's
        recording alone and does nothing.
        """
        if self._owner_pid != os.getpid() or not self._started:
            return
        try:
            self._exit_step_range()
            self._transit(self.current_action, None)
        finally:
            self._abort()

    def step(self) -> None:
        """Mark the start of the next step (iteration).

        An ``on_trace_ready`` that raises propagates from here (as torch does),
        after the finished cycle's session is kept and the next cycle started,
        so the schedule goes on at the next ``step()``.
        """
        if self._owner_pid != os.getpid() or not self._started:
            return
        self._exit_step_range()
        previous = self.current_action
        self.step_num += 1
        StepTracker.increment_step(PROFILER_STEP_NAME)
        self.current_action = as_action(self.schedule(self.step_num))
        try:
            self._transit(previous, self.current_action)
        finally:
            self._enter_step_range()

    def _enter_step_range(self) -> None:
        if self.record_steps:
            self._step_range = record_function(f"{PROFILER_STEP_NAME}#{self.step_num}")
            self._step_range.__enter__()

    def _exit_step_range(self) -> None:
        if self._step_range is not None:
            step_range, self._step_range = self._step_range, None
            step_range.__exit__(None, None, None)

    def _transit(self, previous: ProfilerAction, current: Optional[ProfilerAction]) -> None:
        """Run the steps of one transition. A failing output step ("stop" writing the
        execution trace, "ready") does not skip the steps after it; the first such
        error is raised at the end. A failing "prepare"/"start" is raised at once."""
        failure: Optional[BaseException] = None
        for name in TRANSITIONS.get((previous, current), []):
            if name.startswith("warn:"):
                warnings.warn(name[len("warn:"):], stacklevel=3)
            elif name == "prepare":
                self._prepare_trace()
            elif name == "start":
                self._start_trace()
            elif name in ("stop", "ready"):
                try:
                    if name == "stop":
                        self._stop_trace()
                    else:
                        self._trace_ready()
                except Exception as e:
                    if failure is None:
                        failure = e
                    else:
                        warnings.warn(f"opscope: a second output failed too: {e!r}",
                                      RuntimeWarning, stacklevel=3)
        if failure is not None:
            raise failure

    def _trace_ready(self) -> None:
        if self.on_trace_ready is not None and self._session is not None:
            self.on_trace_ready(self)

    def _drop_sightings(self):
        """Uninstall the memory-category hooks; what they saw, or None."""
        hooks, self._sightings = self._sightings, None
        if hooks is None:
            return None
        hooks.uninstall()
        return hooks.to_array()

    def _abort(self) -> None:
        """Leave no hook installed, whatever happened."""
        self._started = False
        self._drop_sightings()
        self._take_module_ranges()
        StepTracker.erase_step_count(PROFILER_STEP_NAME)
        if self._recording:
            set_recording_collector(None)
            TORCH_FLAG.lower_flag()
            self._recording = False
            try:
                self._collector.stop()
            except Exception:
                pass
        _release(self)

    def _detach_after_fork(self) -> None:
        """In a forked child: drop this (the parent's) recording and every hook it set.

        The native observer disables itself in C++ at the fork; the Python
        collector, the memory and module hooks are dropped here. What the parent
        recorded stays the parent's: this copy is freed, not kept.
        """
        self._step_range = None  # the parent's range; its end is the parent's to record
        self._drop_sightings()
        self._take_module_ranges()
        StepTracker.erase_step_count(PROFILER_STEP_NAME)
        self._recording = False
        self._started = False
        collector = self._collector
        if collector is not None and hasattr(collector, "forget_after_fork"):
            collector.forget_after_fork()

    # -- trace steps ------------------------------------------------------------------
    def _prepare_trace(self) -> None:
        if self._collector is None:
            from opscope.collect import choose_collector

            self._collector = choose_collector()

    def _start_trace(self) -> None:
        self._prepare_trace()
        if self.profile_memory and self._collector.name != "native":
            warnings.warn(f"opscope: profile_memory needs the native collector; the "
                          f"{self._collector.name} collector records no allocations",
                          stacklevel=3)
        if self.execution_trace_observer is not None:
            self.execution_trace_observer.start()
        self._metadata = {}
        for name in OPTION_NAMES:
            if getattr(self, name):
                self._metadata[name] = "1"
        dist_info = _distributed_info()
        if dist_info:
            self._metadata["distributedInfo"] = json.dumps(dist_info)
        if self._configs_metadata is not None:
            self._metadata[CONFIGS_METADATA_KEY] = self._configs_metadata
        self._metadata.update(self.preset_metadata)
        # FLOP formulas need input shapes; torch records them too under with_flops
        self._collector.start(record_shapes=self.record_shapes or self.with_flops,
                              profile_memory=self.profile_memory, with_stack=self.with_stack)
        if self.profile_memory:
            from opscope.collect.memory_hooks import TensorSightings

            self._sightings = TensorSightings()
            self._sightings.install()
        self._recording = True
        set_recording_collector(self._collector)
        # so torch.compile'd code emits its ranges, as under torch.profiler
        TORCH_FLAG.raise_flag(self._collector, self.record_shapes or self.with_flops)
        if self.with_modules:
            from opscope.collect.module_hooks import ModuleRanges

            self._module_ranges = ModuleRanges(self._collector)
            self._module_ranges.install()

    def _take_module_ranges(self) -> Any:
        """Uninstall the module hooks (if any) and hand them over for their results."""
        module_ranges, self._module_ranges = self._module_ranges, None
        if module_ranges is not None:
            module_ranges.uninstall()
        return module_ranges

    def _stop_trace(self) -> None:
        """Stop the collector and build the session FIRST; then stop the execution
        trace, whose error (a full disk) is raised with the session kept."""
        try:
            self._stop_collector()
        finally:
            if self.execution_trace_observer is not None:
                self.execution_trace_observer.stop()

    def _stop_collector(self) -> None:
        if not self._recording:
            return
        module_ranges = self._take_module_ranges()
        set_recording_collector(None)
        TORCH_FLAG.lower_flag()
        self._recording = False
        sightings = self._drop_sightings()
        raw = self._collector.stop()
        options = {name: getattr(self, name) for name in OPTION_NAMES}
        modules = {} if module_ranges is None else dict(
            modules=module_ranges.modules(), module_calls=module_ranges.calls())
        self._session = build_session(raw, options=options, metadata=dict(self._metadata),
                                      memory_sightings=sightings, **modules)
        self._session.marks = take_marks(self._collector, raw.start_ns, raw.stop_ns)
        self._events = None

    # -- results ------------------------------------------------------------------------
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
            self._events = EventList(function_events(self.session),
                                     profile_memory=self.profile_memory,
                                     with_flops=self.with_flops)
        return self._events

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
        if group_by_overload_name:
            return self.events().key_averages(group_by_input_shape, group_by_stack_n,
                                              group_by_overload_name=True,
                                              include_python_functions=include_python_functions)
        rows = session_key_averages(self.session, group_by_input_shape=group_by_input_shape,
                                    group_by_stack_n=group_by_stack_n,
                                    include_python_functions=include_python_functions)
        return EventList(rows, profile_memory=self.profile_memory, with_flops=self.with_flops)

    def _module_averages(self, group_by: str) -> ModuleList:
        if group_by != "module":
            raise ValueError(f"key_averages: group_by must be None or 'module', got {group_by!r}")
        session = self.session
        if session.modules is None:
            raise RuntimeError("key_averages(group_by='module') needs "
                               "opscope.profile(with_modules=True)")
        from opscope.analysis.modules import module_rows

        return ModuleList(module_rows(session), with_flops=self.with_flops)

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

    def add_metadata(self, key: str, value: str) -> None:
        """Add a string entry to the trace's top-level metadata."""
        check_name("add_metadata", "key", key)
        if not isinstance(value, str):
            raise TypeError(f"add_metadata {key!r}: value must be a str, "
                            f"got {type(value).__name__}")
        self.add_metadata_json(key, json.dumps(value))

    def add_metadata_json(self, key: str, value: str) -> None:
        """Add an entry whose value is JSON text to the trace's top-level metadata."""
        check_name("add_metadata_json", "key", key)
        _validate_json(key, value)
        if self._recording or self._session is None:
            self._metadata[key] = value
        else:
            self._session.metadata[key] = value

    def preset_metadata_json(self, key: str, value: str) -> None:
        """Metadata added to every trace this profiler starts from now on."""
        check_name("preset_metadata_json", "key", key)
        self.preset_metadata[key] = _validate_json(key, value)

    def export_chrome_trace(self, path: str) -> None:
        """Write the Chrome/Perfetto trace (gzipped when ``path`` ends in ``.gz``)."""
        path = check_path("export_chrome_trace", "path", path)
        from opscope.export.chrome_trace import write_chrome_trace

        write_chrome_trace(self.session, path)

    def export_memory_timeline(self, path: str, device: Optional[str] = None) -> None:
        """Write memory by category over time; the suffix of ``path`` picks the format.

        ``.json``/``.json.gz``: ``[times, sizes]``; ``.raw.json.gz``: raw rows;
        ``.html``: an offline plot. Needs only ``profile_memory=True``.
        """
        path = check_path("export_memory_timeline", "path", path)
        if not self.profile_memory:
            raise ValueError("export_memory_timeline needs profile_memory=True: create the "
                             "profiler with opscope.profile(profile_memory=True, ...)")
        from opscope.analysis.memory_timeline import parse_device
        from opscope.export.memory_timeline import write_memory_timeline

        if device is not None:
            parse_device(device)  # a bad device fails before any file is touched
        if device is None:
            import torch

            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        write_memory_timeline(self.session, os.fspath(path), device)

    def memory_summary(self, top: int = 10) -> str:
        """Peak memory per step and the ops with the largest self allocations, as text."""
        top = check_int("memory_summary", "top", top, minimum=1)
        from opscope.export.memory_summary import format_memory_summary

        return format_memory_summary(self.session, top=top)

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total") -> None:
        """Write collapsed stacks for flamegraph.pl or speedscope."""
        path = check_path("export_stacks", "path", path)
        from opscope.export.stacks import write_stacks

        write_stacks(self.session, path, metric)

    def export_report(self, path: str) -> None:
        """Write the self-contained HTML report (overview, operators, flame graph, timeline...)."""
        path = check_path("export_report", "path", path)
        from opscope.report import write_report

        write_report(self.session, path)


def _distributed_info() -> Optional[Dict[str, Any]]:
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        info: Dict[str, Any] = {
            "backend": dist.get_backend(),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
        }
        try:
            info["pg_count"] = dist.get_pg_count()
            info["pg_config"] = dist.distributed_c10d._get_all_pg_configs()
        except Exception:
            pass
        return info
    except Exception:
        return None

