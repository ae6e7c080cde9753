"""torch.profiler-compatible event objects, built on demand from an EventTable.

``FunctionEvent`` is one recorded op or range; ``FunctionEventAvg`` is one row
of ``key_averages()``. Attribute names and units (microseconds, bytes) follow
``torch.autograd.profiler_util`` so user code that reads them keeps working.

Example::

    >>> ev = FunctionEvent(id=1, name="aten::add", thread=1, start_us=0.0, end_us=5.0)
    >>> ev.cpu_time_total, ev.key, ev.count
    (5.0, 'aten::add', 1)
"""

from __future__ import annotations

import enum
import sys
from typing import List, Optional

CPU_CODE, CUDA_CODE = 0, 1  # c10::DeviceType's codes


class StandInDeviceType(enum.IntEnum):
    """torch.autograd.DeviceType's first members, for a process that never imported torch
    (``opscope table`` reads a trace without it)."""

    CPU = CPU_CODE
    CUDA = CUDA_CODE


def device_type_enum():
    """torch.autograd.DeviceType once torch is imported, so that comparisons with it hold
    whenever the program reads them; until then :class:`StandInDeviceType`.

    >>> device_type_enum()(CUDA_CODE).name
    'CUDA'
    """
    autograd = getattr(sys.modules.get("torch"), "autograd", None)
    return getattr(autograd, "DeviceType", None) or StandInDeviceType


class Interval:
    """A [start, end] range in microseconds."""

    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float):
        self.start = start
        self.end = end

    def elapsed_us(self) -> float:
        return self.end - self.start

    def __repr__(self) -> str:
        return f"Interval(start={self.start:.3f}, end={self.end:.3f})"


class _CpuEventFields:
    """Fields every event and row carries; device ones stay zero on the CPU collector."""

    device_time_total = 0.0
    self_device_time_total = 0.0
    cuda_time_total = 0.0
    self_cuda_time_total = 0.0
    self_cuda_memory_usage = 0

    def set_device_time(self, self_us: float, total_us: float, use_device: str = "cuda",
                        device_type=None) -> None:
        """Give the event or row device time (a device collector's), under both names.

        >>> row = FunctionEventAvg("k", count=2); row.set_device_time(3.0, 5.0)
        >>> row.self_cuda_time_total, row.device_time_total, row.device_time
        (3.0, 5.0, 2.5)
        """
        self.self_device_time_total = self.self_cuda_time_total = self_us
        self.device_time_total = self.cuda_time_total = total_us
        self.use_device = use_device
        if device_type is not None:
            self.device_type = device_type

    @property
    def device_type(self):
        """CPU, or CUDA for a device row: torch's enum (see :func:`device_type_enum`)."""
        return device_type_enum()(self._device_code)

    @device_type.setter
    def device_type(self, value) -> None:
        self._device_code = int(value)

    def _init_cpu_fields(self) -> None:
        self.device_memory_usage = 0
        self.self_device_memory_usage = 0
        self.is_legacy = False
        self.is_remote = False
        self.use_device = None
        self._device_code = CPU_CODE


class FunctionEvent(_CpuEventFields):
    """One op or range, with the fields torch.profiler's FunctionEvent has."""

    def __init__(self, *, id: int, name: str, thread: int, start_us: float, end_us: float,
                 fwd_thread: Optional[int] = None, input_shapes=None, stack=None, scope: int = 0,
                 sequence_nr: int = -1, is_async: bool = False, flops: Optional[int] = None,
                 concrete_inputs=None, input_dtypes=None, trace_name: Optional[str] = None,
                 overload_name: str = "", is_user_annotation: bool = False,
                 cpu_memory_usage: int = 0, self_cpu_time_total: Optional[float] = None,
                 self_cpu_memory_usage: Optional[int] = None, device_memory_usage: int = 0,
                 self_device_memory_usage: int = 0, module_hierarchy: str = "",
                 fused_modules: Optional[List[str]] = None):
        self.id = id
        self.name = name
        self.key = name
        self.thread = thread
        self.fwd_thread = fwd_thread
        self.time_range = Interval(start_us, end_us)
        self.input_shapes = input_shapes if input_shapes is not None else []
        self.input_dtypes = input_dtypes if input_dtypes is not None else []
        self.concrete_inputs = concrete_inputs if concrete_inputs is not None else []
        self.kwinputs: dict = {}
        self.stack = stack if stack is not None else []
        self.scope = scope
        self.sequence_nr = sequence_nr
        self.is_async = is_async
        self.flops = flops
        self.trace_name = trace_name
        self.overload_name = overload_name
        self.is_user_annotation = is_user_annotation
        self.cpu_memory_usage = cpu_memory_usage
        self.self_cpu_memory_usage = (cpu_memory_usage if self_cpu_memory_usage is None
                                      else self_cpu_memory_usage)
        self._init_cpu_fields()
        self.device_memory_usage = device_memory_usage
        self.self_device_memory_usage = self_device_memory_usage
        self.cpu_parent: Optional["FunctionEvent"] = None
        self.cpu_children: List["FunctionEvent"] = []
        self.kernels: list = []
        self.count = 1
        self.node_id = -1
        self.device_index = 0
        self.device_resource_id = thread
        self.is_python_function = False
        # the module that ran it, as the trace's "Module Hierarchy" (with_modules), or ''
        self.module_hierarchy = module_hierarchy
        # a compiled kernel fused from FX nodes of several modules: each of them with its
        # node count, most first ("0.ln (LayerNorm) x10"); [] for every other event
        self.fused_modules = list(fused_modules) if fused_modules else []
        self._self_cpu_time_total = self_cpu_time_total

    def append_cpu_child(self, child: "FunctionEvent") -> None:
        self.cpu_children.append(child)

    def set_cpu_parent(self, parent: "FunctionEvent") -> None:
        self.cpu_parent = parent

    @property
    def cpu_time_total(self) -> float:
        return self.time_range.elapsed_us()

    @property
    def self_cpu_time_total(self) -> float:
        if self._self_cpu_time_total is not None:
            return self._self_cpu_time_total
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / max(1, self.count)

    @property
    def device_time(self) -> float:
        return self.device_time_total / max(1, self.count)

    def __repr__(self) -> str:
        return (f"<FunctionEvent id={self.id} name={self.name} thread={self.thread} "
                f"cpu_time_total={self.cpu_time_total:.3f}us "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us "
                f"input_shapes={self.input_shapes}>")


class FunctionEventAvg(_CpuEventFields):
    """One aggregated row of ``key_averages()``: sums over the events of a key."""

    def __init__(self, key: str = "", *, count: int = 0, cpu_time_total: float = 0.0,
                 self_cpu_time_total: float = 0.0, input_shapes=None, stack=None,
                 scope: int = 0, cpu_memory_usage: int = 0, self_cpu_memory_usage: int = 0,
                 flops: int = 0, is_async: bool = False, is_user_annotation: bool = False,
                 overload_name: str = "", node_id: int = -1):
        self.key = key
        self.count = count
        self.cpu_time_total = cpu_time_total
        self.self_cpu_time_total = self_cpu_time_total
        self.input_shapes = input_shapes
        self.stack = stack if stack is not None else []
        self.scope = scope
        self.cpu_memory_usage = cpu_memory_usage
        self.self_cpu_memory_usage = self_cpu_memory_usage
        self._init_cpu_fields()
        self.flops = flops
        self.is_async = is_async
        self.is_user_annotation = is_user_annotation
        self.overload_name = overload_name
        self.node_id = node_id
        self.cpu_parent = None
        self.cpu_children = None

    @property
    def cpu_time(self) -> float:
        return 0.0 if self.count == 0 else self.cpu_time_total / self.count

    @property
    def device_time(self) -> float:
        return 0.0 if self.count == 0 else self.device_time_total / self.count

    def add(self, other) -> "FunctionEventAvg":
        """Accumulate a FunctionEvent or FunctionEventAvg, as torch's ``add`` does.

        >>> FunctionEventAvg().add(3)
        Traceback (most recent call last):
        ...
        TypeError: FunctionEventAvg.add: other must be a FunctionEvent or FunctionEventAvg, got int 3
        """
        if not isinstance(other, (FunctionEvent, FunctionEventAvg)):
            raise TypeError("FunctionEventAvg.add: other must be a FunctionEvent or "
                            f"FunctionEventAvg, got {type(other).__name__} {other!r:.60}")
        if self.count == 0 and not self.key:
            self.key = other.key
            self.input_shapes = other.input_shapes
            self.stack = other.stack
            self.scope = other.scope
            self.is_user_annotation = getattr(other, "is_user_annotation", False)
            self.overload_name = getattr(other, "overload_name", "")
            self.node_id = getattr(other, "node_id", -1)
        self.cpu_time_total += other.cpu_time_total
        self.self_cpu_time_total += other.self_cpu_time_total
        self.cpu_memory_usage += other.cpu_memory_usage
        self.self_cpu_memory_usage += other.self_cpu_memory_usage
        self.count += other.count
        if other.device_time_total or other.self_device_time_total:
            self.set_device_time(self.self_device_time_total + other.self_device_time_total,
                                 self.device_time_total + other.device_time_total,
                                 other.use_device or "cuda")
        if other.flops:
            self.flops += other.flops
        return self

    def __iadd__(self, other) -> "FunctionEventAvg":
        return self.add(other)

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total:.3f}us "
                f"cpu_time={self.cpu_time:.3f}us input_shapes={self.input_shapes}>")
