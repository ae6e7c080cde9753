"""One recording window: a collector and the probes that go with it.

``Recording.start()`` starts the collector, wires user ranges to it, raises
torch's "a profiler runs" flag (so compiled code emits its ranges), then
starts the probes (``collect/probes.py``) the options and ``activities`` ask
for: the memory sightings (``profile_memory``), the module ranges
(``with_modules``), the device collector (``device``, for
``ProfilerActivity.CUDA``). ``stop()`` stops the probes and the collector and
returns the collector's ``RawSession`` with ``metadata``, ``marks`` and each
probe's fields (``memory_sightings``, ``modules``, ``module_calls``,
``device``...) filled in, ready for ``build_session``. ``discard()`` undoes it without raising, whatever state it
is in; ``forget_after_fork()`` drops it in a forked child. On a multi-rank
job the window also estimates this rank's clock offset to rank 0
(``collect/job/clock_sync.py``) from ``start()`` and, when there is one, writes it
as ``opscopeClockOffsetNs`` at ``stop()``.

The API layer passes in what lives above ``collect/``: ``wire`` (points user
ranges at a collector, or at nothing with None) and ``take_marks`` (the marks
recorded into a collector between two times).

Example::

    >>> from opscope.collect.python.collector import PythonCollector
    >>> rec = Recording(PythonCollector(), metadata={"run": '"a"'})
    >>> rec.start()
    >>> raw = rec.stop()
    >>> raw.collector, raw.metadata, raw.marks, raw.memory_sightings
    ('python', {'run': '"a"'}, [], None)
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple


from opscope.collect.job.clock_sync import ClockSync
from opscope.collect.collector import Collector
from opscope.collect.job.flight_recorder import FlightDrain, issued_collectives
from opscope.collect.inductor_sites import (compiled_code_ran, compiled_frames_so_far,
                                            compiled_sites, graph_breaks_so_far)
from opscope.collect.probes import window_probes
from opscope.collect.profiler_flag import TORCH_FLAG
from opscope.model.records import RawSession
from opscope.model.torch_names import (CLOCK_OFFSET_KEY, COMPILED_FRAMES_KEY, FLIGHT_RECORDER_KEY,
                                       GRAPH_BREAKS_KEY, PROCESS_GROUP_CALLS_KEY)

Mark = Tuple[int, int, str]


def _no_wire(_collector: Optional[Collector]) -> None:
    """The default ``wire``: user ranges are not routed anywhere."""


def _no_marks(_collector: Collector, _start_ns: int, _stop_ns: int) -> List[Mark]:
    """The default ``take_marks``: no marks."""
    return []


class Recording:
    """A collector plus the hooks of one window; ``start()`` then ``stop() -> RawSession``.

    ``metadata`` (a dict the caller may keep adding to until ``stop``) goes
    into the RawSession as it is at ``stop``. FLOP estimates need input
    shapes, so ``with_flops`` records them as ``record_shapes`` does.
    """

    def __init__(self, collector: Collector, *, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 with_flops: bool = False, with_modules: bool = False,
                 metadata: Optional[Dict[str, str]] = None,
                 wire: Callable[[Optional[Collector]], None] = _no_wire,
                 take_marks: Callable[[Collector, int, int], List[Mark]] = _no_marks,
                 device: bool = False, probes: Optional[List[Any]] = None):
        self.collector = collector
        # the sources beside the collector (collect/probes.py): memory roles, module
        # ranges, the device collector (``device``: ProfilerActivity.CUDA), then ``probes``
        self.probes: List[Any] = window_probes(
            collector, profile_memory=profile_memory, with_modules=with_modules,
            device=device) + list(probes or [])
        self.record_shapes = record_shapes or with_flops
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_modules = with_modules
        self.metadata: Dict[str, str] = {} if metadata is None else metadata
        self._wire = wire
        self._take_marks = take_marks
        self._running = False  # the collector was started and not stopped yet
        self._clock: Optional[ClockSync] = None  # this window's clock offset estimate
        self._flights: Optional[FlightDrain] = None  # torch's flight recorder, read at steps

    @property
    def running(self) -> bool:
        """True between ``start()`` and ``stop()``/``discard()``."""
        return self._running

    def start(self) -> None:
        """Start the collector, then the probes the options ask for."""
        flights = FlightDrain(time.time_ns())
        self.collector.start(record_shapes=self.record_shapes,
                             profile_memory=self.profile_memory, with_stack=self.with_stack)
        self._running = True
        self._wire(self.collector)
        # so torch.compile'd code emits its ranges, as under torch.profiler
        TORCH_FLAG.raise_flag(self.collector, self.record_shapes)
        self._start_probes()
        self._start_clock_sync()
        self._flights = flights

    def on_step(self) -> None:
        """At a ``prof.step()``: keep the flight recorder's rows before its buffer wraps."""
        if self._flights is not None:
            self._flights.on_step()

    def _start_probes(self) -> None:
        """Start each probe; one that cannot start is dropped with one warning line."""
        started = []
        for probe in self.probes:
            try:
                probe.start()
            except Exception as exc:  # noqa: BLE001  (never harm the job: CPU recording goes on)
                if getattr(probe, "required", False):  # its option asked for it: fail the start
                    self.probes = started + [probe]
                    raise
                if getattr(exc, "said", False):  # its one line is already printed
                    continue
                warnings.warn(f"opscope: {getattr(probe, 'name', 'a')} activity not recorded: "
                              f"{' '.join(str(exc).split())[:300]}; recording the CPU side",
                              RuntimeWarning, stacklevel=4)
                continue
            started.append(probe)
        self.probes = started

    def _stop_probes(self) -> Dict[str, Any]:
        """Each started probe's RawSession fields; a probe that fails is warned about."""
        fields: Dict[str, Any] = {}
        probes, self.probes = self.probes, []
        for probe in probes:
            try:
                fields.update(probe.stop())
            except Exception as exc:  # noqa: BLE001  (what the collector recorded is kept)
                warnings.warn(f"opscope: {getattr(probe, 'name', 'a')} activity lost at stop: "
                              f"{' '.join(str(exc).split())[:300]}", RuntimeWarning, stacklevel=4)
        return fields

    def stop(self) -> RawSession:
        """Stop every probe and the collector; the RawSession with all they saw."""
        probe_fields = self._stop_probes()
        self._unwire()
        raw = self.collector.stop()
        metadata = dict(self.metadata)
        offset = self._take_clock_offset()
        if offset is not None:
            metadata[CLOCK_OFFSET_KEY] = json.dumps(offset)
        drain, self._flights = self._flights, None
        flights = drain.rows() if drain is not None and issued_collectives(
            raw.names, raw.records["name_id"]) else None
        if flights:
            metadata[FLIGHT_RECORDER_KEY] = json.dumps(flights, separators=(",", ":"))
        calls = probe_fields.pop("process_group_calls", None)
        if calls:
            metadata[PROCESS_GROUP_CALLS_KEY] = json.dumps(calls, separators=(",", ":"))
        extra: Dict[str, Any] = dict(
            metadata=metadata, memory_sightings=None,
            marks=self._take_marks(self.collector, raw.start_ns, raw.stop_ns))
        extra.update(probe_fields)
        extra["compiled_sites"] = compiled_sites(raw.names, raw.records["name_id"])
        ran = extra["compiled_sites"] is not None or compiled_code_ran(
            raw.names, raw.records["name_id"])  # graph level too (a torch lacking a hook)
        breaks = graph_breaks_so_far() if ran else None
        if breaks:
            metadata[GRAPH_BREAKS_KEY] = json.dumps(breaks)
        frames = compiled_frames_so_far() if ran else None
        if frames:
            metadata[COMPILED_FRAMES_KEY] = json.dumps(frames)
        return dataclasses.replace(raw, **extra)

    def discard(self) -> None:
        """Stop every probe and the collector, keeping nothing; never raises."""
        clock, self._clock = self._clock, None
        self._flights = None
        if clock is not None:
            clock.cancel()
        probes, self.probes = self.probes, []
        for probe in probes:
            try:
                probe.discard()
            except Exception:  # noqa: BLE001  (nothing is kept: its error neither)
                pass
        if self._running:
            self._unwire()
            try:
                self.collector.stop()
            except Exception:  # noqa: BLE001  (nothing is kept: its error neither)
                pass

    def forget_after_fork(self) -> None:
        """In a forked child: drop the probes; the collector's recording is the parent's."""
        self._clock = None  # its thread stayed in the parent
        self._flights = None
        probes, self.probes = self.probes, []
        for probe in probes:
            probe.forget_after_fork()
        self._running = False

    def _start_clock_sync(self) -> None:
        try:
            self._clock = ClockSync.start()
        except Exception as exc:  # noqa: BLE001  (never harm the job: one line, no offset)
            warnings.warn(f"opscope: cannot estimate the clock offset to rank 0: {exc}",
                          RuntimeWarning, stacklevel=3)

    def _take_clock_offset(self) -> Optional[int]:
        """The clock offset to rank 0 to write, or None (with one warning line why)."""
        clock, self._clock = self._clock, None
        if clock is None:
            return None
        offset = clock.offset()
        if offset is None and clock.problem:
            warnings.warn(f"opscope: no {CLOCK_OFFSET_KEY} in this trace: {clock.problem}",
                          RuntimeWarning, stacklevel=3)
        return offset

    def _unwire(self) -> None:
        self._wire(None)
        TORCH_FLAG.lower_flag()
        self._running = False

