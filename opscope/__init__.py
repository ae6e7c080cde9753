"""opscope: a profiler for PyTorch programs, with torch.profiler's API.

Replace ``torch.profiler`` with ``opscope`` and the same code runs:

>>> import os, tempfile, torch
>>> import opscope
>>> model = torch.nn.Linear(4, 2)
>>> with opscope.profile(record_shapes=True) as prof:
...     model(torch.ones(3, 4)).sum().backward()
>>> table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
>>> "aten::addmm" in table
True
>>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
>>> prof.export_chrome_trace(path)

A saved trace (or a store's window) reads back with the same results API:

>>> "aten::addmm" in opscope.load(path).table(row_limit=10)
True
"""

from __future__ import annotations

from opscope.activity import DeviceType, ProfilerActivity, supported_activities
from opscope.configs import CuspyConfig, PerformanceMetricsConfig, ProfilerActivityConfig
from opscope.handlers import report_handler, store_handler, tensorboard_trace_handler
from opscope.profiler import profile
from opscope.record_function import record_function
from opscope.schedule import ProfilerAction, schedule
from opscope import autograd, itt  # noqa: F401  (opscope.autograd.profile, opscope.itt.mark)
from opscope.on_demand import disable_on_demand, enable_on_demand, enable_from_environment
from opscope.step_tracker import track_optimizer_steps

from opscope.execution_trace import ExecutionTraceObserver
from opscope.version import __version__
from opscope.session_profile import SessionProfile
import opscope.load as _load_package
from opscope.session_profile import load as _load


class _CallableLoadPackage(type(_load_package)):
    """``opscope.load`` is the loader package and, called, ``session_profile.load``."""

    def __call__(self, path_or_store, rank=None, window=None, **options):
        return _load(path_or_store, rank, window, **options)


# opscope.load(path_or_store, rank=None, window=None): a saved profile with a live one's
# results API; opscope.load.read_trace and its other names stay importable as they were.
_load_package.__class__ = _CallableLoadPackage
_CallableLoadPackage.__call__.__doc__ = _load.__doc__


__all__ = [
    "profile",
    "schedule",
    "supported_activities",
    "tensorboard_trace_handler",
    "report_handler",
    "store_handler",
    "ProfilerAction",
    "ProfilerActivity",
    "CuspyConfig",
    "PerformanceMetricsConfig",
    "ProfilerActivityConfig",
    "kineto_available",
    "DeviceType",
    "record_function",
    "ExecutionTraceObserver",
    "SessionProfile",
    "load",
    "enable_on_demand",
    "disable_on_demand",
]


def kineto_available() -> bool:
    """True when opscope's native collector builds and loads on this machine.

    (torch's name is kept for compatibility; opscope does not use Kineto.)
    """
    from opscope.collect import native_available

    return native_available()


# Every optimizer.step() feeds opscope.step_tracker (a cheap global post-hook);
# OPSCOPE_ON_DEMAND=1 makes this process answer `opscope trigger` (opscope.on_demand).
track_optimizer_steps()
enable_from_environment()
