"""A finished profiling session: the analysed event table plus its settings.

This is what exporters and reports read. It can be built from a live
collector (``opscope.profile``) or from synthetic records in tests.

Build one with ``opscope.analysis.build.build_session(raw)``.

Example::

    >>> from opscope.model.records import FLAG_PYTHON_FUNCTION, RawSession  # noqa: F401
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> s.options["record_shapes"], len(s.table)
    (False, 0)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from opscope.model.events import EventTable
from opscope.model.modules import ModuleCall, ModuleInfo
from opscope.model.records import FLAG_PYTHON_FUNCTION, RawSession  # noqa: F401

OPTION_NAMES = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


@dataclass
class ProfileSession:
    """Events of one active window, tree built, with what the user asked for.

    ``metadata`` maps a key to a JSON *text* value, as ``add_metadata_json``
    takes it; exporters write it verbatim after validating it parses.
    """

    table: EventTable
    options: Dict[str, bool] = field(default_factory=lambda: {k: False for k in OPTION_NAMES})
    metadata: Dict[str, str] = field(default_factory=dict)
    process_id: int = field(default_factory=os.getpid)
    start_ns: int = 0  # collector clock
    stop_ns: int = 0
    epoch_offset_ns: int = 0  # collector clock + offset = Unix ns
    collector: str = "native"
    trace_name: Optional[str] = None
    # Per event (table order): Python frames innermost-first, as torch orders
    # FunctionEvent.stack, or None where none was recorded. None: no stacks at all.
    stacks: Optional[List[Optional[List[str]]]] = None
    # profile_memory: allocator records in time order (records.MEMORY_DTYPE), the
    # event owning each (-1: none), and per-event arrays cpu_memory_usage,
    # self_cpu_memory_usage, device_memory_usage, self_device_memory_usage.
    memory: Optional[np.ndarray] = None
    memory_owner: Optional[np.ndarray] = None
    event_memory: Optional[Dict[str, np.ndarray]] = None
    # Tensors seen in known roles (model.memory.SIGHTING_DTYPE), for categories.
    memory_sightings: Optional[np.ndarray] = None
    @property
    def self_cpu_memory(self) -> Optional[np.ndarray]:
        """Per event: bytes allocated by the event itself (profile_memory), or None."""
        return None if self.event_memory is None else self.event_memory["self_cpu_memory_usage"]

    @property
    def cpu_memory(self) -> Optional[np.ndarray]:
        """Per event: bytes allocated by the event and everything under it, or None."""
        return None if self.event_memory is None else self.event_memory["cpu_memory_usage"]

    # opscope.itt.mark() calls while recording: (collector-clock ns, OS thread id, message)
    marks: List[Tuple[int, int, str]] = field(default_factory=list)
    # with_flops: per event (table order) FLOP estimate, int64, 0 where none
    # (opscope.analysis.flops.event_flops). None: FLOPs were not estimated.
    flops: Optional[np.ndarray] = None
    # with_modules: module range name -> ModuleInfo; a user range whose name is a key
    # here is a module forward call (see opscope.model.modules). None: not recorded.
    modules: Optional[Dict[str, ModuleInfo]] = None
    # with_modules: every forward call with its autograd sequence numbers, call order
    module_calls: List[ModuleCall] = field(default_factory=list)
    # A saved trace's: the file read (for a folder, the trace chosen in it), OS thread
    # id -> name, and its python_function rule (load.trace_events.PYTHON_FUNCTION_RULES)
    source_path: str = ""
    thread_names: Dict[int, str] = field(default_factory=dict)
    python_functions: str = "counted"
    # A device collector's work (kernels, copies, memsets) linked to table rows
    # (model.device.DeviceEvents); None: no device activity was recorded.
    device: Optional[Any] = None
    # with_modules: table row -> the modules of a compiled kernel fused from FX nodes of
    # several modules, as "0.ln (LayerNorm) x10" (model.modules); only such kernels are keys
    fused_modules: Dict[int, Tuple[str, ...]] = field(default_factory=dict)
    # table row -> a collective's facts (model.collective_facts.CollectiveFacts): its
    # process group, sequence number, element counts, dtype; only such rows are keys
    collective_facts: Dict[int, Any] = field(default_factory=dict)
    # derived per-event facts, each computed once on first use (see ``derived``)
    _derived: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def python_function_rows(self) -> np.ndarray:
        """Per event: True where it is a saved trace's ``python_function`` event."""
        return (self.table.flags & FLAG_PYTHON_FUNCTION) != 0

    def derived(self, key: str, compute: Callable[["ProfileSession"], Any]) -> Any:
        """``compute(self)``, cached under ``key``: a derived fact is computed once.

        Analysis defines the facts (``opscope.analysis``); exporters and the
        report read them through it, so none recomputes what another did.

        >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
        >>> s.derived("n", lambda s: len(s.table)), s.derived("n", lambda s: -1)
        (0, 0)
        """
        try:
            return self._derived[key]
        except KeyError:
            value = self._derived[key] = compute(self)
            return value
