"""``opscope.profile``: the torch.profiler API, conducting our collector.

This module owns the schedule state machine and wires a collector to the
model: each active window is one ``collect.recording.Recording``, whose
``RawSession`` goes to ``build_session``. It formats nothing itself: the
results and output files are ``results.ProfileResults``, which
writes through ``opscope.outputs``; the one-profiler-per-process claim
and the fork handler are ``fork``; the start metadata and argument
checks are ``options``.

Example::

    >>> import torch, opscope
    >>> with opscope.profile() as prof:
    ...     _ = torch.ones(4) + 1
    >>> "aten::add" in [row.key for row in prof.key_averages()]
    True
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Callable, Dict, Iterable, Optional

from opscope.activity import ProfilerActivity, resolve_activity_configs
from opscope.black_box.registry import lend_to_profile, shared_with_black_box
from opscope.analysis.build import build_session
from opscope.arguments import check_bool, check_callable, check_name
from opscope.collect.collector import Collector
from opscope.collect.recording import Recording
from opscope.configs import unapplied_configs_metadata
from opscope.event_list import EventList
from opscope.itt import take_marks
from opscope.model.session import OPTION_NAMES, ProfileSession
from opscope.model.torch_names import PROFILER_STEP
from opscope.api.fork import active_profiler, claim, release
from opscope.api.results import ProfileResults
from opscope.api.options import (check_optional, complete_distributed_info, start_metadata,
                                    validate_json)
from opscope.record_function import record_function, set_recording_collector
from opscope.schedule import (NEW_CYCLE_WARNING, OUTPUT_STEPS, TRANSITIONS, WARN_PREFIX,
                              ProfilerAction, as_action, default_schedule, warn_once)
from opscope.step_tracker import StepTracker

PROFILER_STEP_NAME = PROFILER_STEP


def __getattr__(name: str) -> Any:
    """``opscope.api.profiler._active``: the running profiler (kept in ``fork``)."""
    if name == "_active":
        return active_profiler()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class profile(ProfileResults):
    """Profile the code in a ``with`` block, or between ``start()`` and ``stop()``.

    Arguments and behaviour follow ``torch.profiler.profile``. With a
    ``schedule``, call ``step()`` once per iteration; each active cycle ends
    by calling ``on_trace_ready(prof)``. ``activities`` may hold torch 2.15's
    ``{ProfilerActivity.CUDA: ProfilerActivityConfig(...)}`` dicts on any torch;
    configs opscope does not apply are kept in the trace metadata.
    ``acc_events=True`` keeps every finished cycle in ``key_averages()`` and
    ``events()`` (the exports write the last window); without it, the start
    of a new cycle warns once that only the current cycle is reported, as
    torch does.

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

    Each trace's ``distributedInfo`` comes from the process group at the
    window's start, else at the first ``step()`` or stop that finds one (a
    script may create its group after ``start()``), else from torchrun's
    ``RANK``/``WORLD_SIZE`` when the group is gone by the stop.
    """

    def __init__(self, *, activities: Optional[Iterable[Any]] = None,
                 schedule: Optional[Callable[[int], Any]] = None,
                 on_trace_ready: Optional[Callable[..., Any]] = None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Any = None,
                 execution_trace_observer: Any = None, acc_events: bool = False,
                 use_cuda: Optional[bool] = None):
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
        self.acc_events = check_bool("profile", "acc_events", acc_events)
        from torch._C._profiler import _ExperimentalConfig

        from opscope.execution_trace import ExecutionTraceObserver

        self.experimental_config = check_optional(
            "experimental_config", experimental_config, _ExperimentalConfig,
            "a torch.profiler._ExperimentalConfig")
        self.execution_trace_observer = check_optional(
            "execution_trace_observer", execution_trace_observer, ExecutionTraceObserver,
            "an opscope.ExecutionTraceObserver")
        self.record_steps = schedule is not None
        self.schedule = schedule if schedule is not None else default_schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.current_action = as_action(self.schedule(self.step_num))
        self.preset_metadata: Dict[str, str] = {}
        self._collector: Optional[Collector] = None
        self._window: Optional[Recording] = None  # the active window's recording
        self._metadata: Dict[str, str] = {}  # the active window's (its Recording's) metadata
        self._session: Optional[ProfileSession] = None
        self._events: Optional[EventList] = None
        self._step_range: Optional[record_function] = None
        self._started = False  # between start() and stop()
        self._owner_pid = os.getpid()  # a forked child never drives its parent's profiler
        # opscope run's profiler yields to a profiler the script starts: this is called
        # (one line for the user) when it stands down; see fork.claim
        self._yield_note: Optional[Callable[[], None]] = None
        self.stood_down = False
        self._earlier_sessions = []  # acc_events: the finished windows before _session
        self._warn_new_cycle = True  # torch's hint that a new cycle drops the last one

    @property
    def _recording(self) -> bool:
        """True while an active window records."""
        return self._window is not None

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
        claim(self)
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

        A user's own ``on_trace_ready`` that raises propagates from here (as
        torch does), after the finished cycle's session is kept and the next
        cycle started, so the schedule goes on at the next ``step()``. opscope's
        handlers (``opscope.handlers``) never raise here: they warn once.
        """
        if self._owner_pid != os.getpid() or not self._started:
            return
        self._exit_step_range()
        if self._window is not None:  # a script's process group may begin after start()
            complete_distributed_info(self._window.metadata, final=False)
            self._window.on_step()
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
        """Run the steps of one transition (``schedule.TRANSITIONS``) through ``_STEPS``.

        A failing output step (``schedule.OUTPUT_STEPS``: "stop" writing the
        execution trace, "ready") does not skip the steps after it; the first
        such error is raised at the end, a second one only warns. A failing
        "prepare"/"start" is raised at once.
        """
        failure: Optional[BaseException] = None
        for name in TRANSITIONS.get((previous, current), []):
            if name.startswith(WARN_PREFIX):
                warnings.warn(name[len(WARN_PREFIX):], stacklevel=3)
            elif name not in OUTPUT_STEPS:
                self._STEPS[name](self)
            else:
                try:
                    self._STEPS[name](self)
                except Exception as e:
                    if failure is None:
                        failure = e
                    else:
                        warnings.warn(f"opscope: a second output failed too: {e!r}",
                                      RuntimeWarning, stacklevel=3)
        if failure is not None:
            raise failure

    def _abort(self) -> None:
        """Leave no hook installed, whatever happened."""
        self._started = False
        window, self._window = self._window, None
        if window is not None:
            window.discard()
        StepTracker.erase_step_count(PROFILER_STEP_NAME)
        release(self)

    def _stand_down(self) -> None:
        """Another profiler takes over (see ``_yield_note``): drop this recording for good.

        The open step range is closed and the window discarded; ``step()`` and
        ``stop()`` then do nothing. The note is said once.
        """
        if not self._started:
            return
        try:
            self._exit_step_range()
        finally:
            self._started = False
            window, self._window = self._window, None
            if window is not None:
                window.discard()
            StepTracker.erase_step_count(PROFILER_STEP_NAME)
            self.stood_down = True
        note, self._yield_note = self._yield_note, None
        if note is not None:
            note()

    def _detach_after_fork(self) -> None:
        """In a forked child: drop this (the parent's) recording and every hook it set.

        The native observer disables itself in C++ at the fork; the Python
        collector, the memory and module hooks are dropped here. What the parent
        recorded stays the parent's: this copy is freed, not kept.
        """
        self._step_range = None  # the parent's range; its end is the parent's to record
        window, self._window = self._window, None
        if window is not None:
            window.forget_after_fork()
        StepTracker.erase_step_count(PROFILER_STEP_NAME)
        self._started = False
        if self._collector is not None:
            self._collector.forget_after_fork()

    # -- trace steps ------------------------------------------------------------------
    def _prepare_trace(self) -> None:
        if self._session is not None and not self.acc_events and self._warn_new_cycle:
            warn_once(NEW_CYCLE_WARNING)
        if self._collector is None:
            from opscope.collect import choose_collector

            self._collector = choose_collector()

    def _start_trace(self) -> None:
        self._prepare_trace()
        collector = self._collector
        assert collector is not None
        if self.profile_memory and collector.name != "native":
            warnings.warn(f"opscope: profile_memory needs the native collector; the "
                          f"{collector.name} collector records no allocations",
                          stacklevel=3)
        if self.execution_trace_observer is not None:
            self.execution_trace_observer.start()
        self._metadata = start_metadata({name: getattr(self, name) for name in OPTION_NAMES},
                                        self._configs_metadata, self.preset_metadata)
        window = Recording(collector, record_shapes=self.record_shapes,
                           profile_memory=self.profile_memory, with_stack=self.with_stack,
                           with_flops=self.with_flops, with_modules=self.with_modules,
                           metadata=self._metadata, wire=set_recording_collector,
                           take_marks=take_marks,
                           device=ProfilerActivity.CUDA in self.activities)
        lend_to_profile()  # a running black box stands by; this window's records join its ring
        try:
            window.start()
        except BaseException:
            window.discard()
            raise
        self._window = window

    def _stop_trace(self) -> None:
        """Stop the collector and build the session FIRST; then stop the execution
        trace, whose error (a full disk) is raised with the session kept."""
        try:
            self._stop_collector()
        finally:
            if self.execution_trace_observer is not None:
                self.execution_trace_observer.stop()

    def _stop_collector(self) -> None:
        window, self._window = self._window, None
        if window is None:
            return
        complete_distributed_info(window.metadata, final=True)
        options = {name: getattr(self, name) for name in OPTION_NAMES}
        # no name holds the RawSession here, so build_session can free its records early
        session = build_session(shared_with_black_box(window.stop()), options=options)
        if self.acc_events and self._session is not None:
            self._earlier_sessions.append(self._session)
        self._session = session
        self._events = None

    def _trace_ready(self) -> None:
        if self.on_trace_ready is not None and self._session is not None:
            self.on_trace_ready(self)

    # schedule.TRANSITIONS' step names -> the method that takes the step
    _STEPS: Dict[str, Callable[["profile"], None]] = {
        "prepare": _prepare_trace,
        "start": _start_trace,
        "stop": _stop_trace,
        "ready": _trace_ready,
    }

    # -- metadata -----------------------------------------------------------------------
    def add_metadata(self, key: str, value: str) -> None:
        """Add a string entry to the trace's top-level metadata."""
        check_name("add_metadata", "key", key)
        if not isinstance(value, str):
            raise TypeError(f"add_metadata {key!r}: value must be a str, "
                            f"got {type(value).__name__}")
        self.add_metadata_json(key, json.dumps(value))

    def add_metadata_json(self, key: str, value: str) -> None:
        """Add an entry whose value is JSON text to the trace's top-level metadata.

        While recording (or before any window), it goes into the window's
        metadata; after stop, the profiler's session is replaced by a copy
        with the entry added (a session is never edited once built).
        """
        check_name("add_metadata_json", "key", key)
        validate_json(key, value)
        if self._recording or self._session is None:
            self._metadata[key] = value
        else:
            self._session = dataclasses.replace(
                self._session, metadata={**self._session.metadata, key: value}, _derived={})

    def preset_metadata_json(self, key: str, value: str) -> None:
        """Metadata added to every trace this profiler starts from now on."""
        check_name("preset_metadata_json", "key", key)
        self.preset_metadata[key] = validate_json(key, value)
