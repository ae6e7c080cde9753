"""opscope: a profiler for PyTorch programs, with torch.profiler's API.

Replace ``torch.profiler`` with ``opscope`` and the same code runs::

    import opscope
    with opscope.profile(record_shapes=True) as prof:
        train_step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")
"""

from __future__ import annotations

from opscope.activity import DeviceType, ProfilerActivity, supported_activities
from opscope.handlers import tensorboard_trace_handler
from opscope.profiler import profile
from opscope.record_function import record_function
from opscope.schedule import ProfilerAction, schedule

# Interim: torch's own ExecutionTraceObserver, which profile() drives through its
# start()/stop()/cleanup() interface. Ours replaces it (see the issue tracker).
from torch.profiler import ExecutionTraceObserver

__version__ = "0.1.0"

__all__ = [
    "profile",
    "schedule",
    "supported_activities",
    "tensorboard_trace_handler",
    "ProfilerAction",
    "ProfilerActivity",
    "kineto_available",
    "DeviceType",
    "record_function",
    "ExecutionTraceObserver",
]


def kineto_available() -> bool:
    """True when opscope's native collector builds and loads on this machine.

    (torch's name is kept for compatibility; opscope does not use Kineto.)
    """
    from opscope.collect import native_available

    return native_available()
