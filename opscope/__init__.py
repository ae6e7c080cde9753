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

import importlib
from typing import Any

from opscope.version import __version__  # noqa: F401  (opscope.__version__, public)
# Functions named as their modules are bound now (both light): a later first import of
# the module would otherwise set ``opscope.schedule`` to the module.
from opscope.record_function import record_function
from opscope.schedule import ProfilerAction, schedule

# The API, imported on first use: ``import opscope`` imports no torch, so the CLI's
# verbs that need none (--help, trigger, query...) start fast. name -> its module.
_API = {
    "DeviceType": "opscope.activity", "ProfilerActivity": "opscope.activity",
    "supported_activities": "opscope.activity",
    "CuspyConfig": "opscope.configs", "PerformanceMetricsConfig": "opscope.configs",
    "ProfilerActivityConfig": "opscope.configs",
    "report_handler": "opscope.handlers", "store_handler": "opscope.handlers",
    "tensorboard_trace_handler": "opscope.handlers",
    "profile": "opscope.api.profiler", "blackbox": "opscope.black_box.box",
    "disable_on_demand": "opscope.on_demand", "enable_on_demand": "opscope.on_demand",
    "track_optimizer_steps": "opscope.step_tracker",
    "ExecutionTraceObserver": "opscope.execution_trace",
    "SessionProfile": "opscope.api.session_profile",
}

__all__ = [
    "profile",
    "blackbox",
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


def __getattr__(name: str) -> Any:
    """An API name (``opscope.profile`` ...) or a submodule (``opscope.itt``), on first use."""
    module = _API.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name.startswith("__"):
        raise AttributeError(f"module 'opscope' has no attribute {name!r}")
    else:
        try:
            value = importlib.import_module(f"opscope.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"opscope.{name}":
                raise
            raise AttributeError(f"module 'opscope' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_API))


def kineto_available() -> bool:
    """True when opscope's native collector builds and loads on this machine.

    (torch's name is kept for compatibility; opscope does not use Kineto.)
    """
    from opscope.collect import native_available

    return native_available()


def _with_torch() -> None:
    """Once the program has torch, every optimizer.step() feeds opscope.step_tracker (a
    cheap global post-hook)."""
    from opscope.step_tracker import track_optimizer_steps

    track_optimizer_steps()


def _install_inductor_notes() -> None:
    """torch.compile'd CPU kernels as ops, with their modules and source lines: patched into
    Inductor as torch imports it (``opscope.collect.inductor_install``); never fails import."""
    try:
        from opscope.collect.inductor_install import install
        from opscope.torch_import import after_import

        install(after_import)
    except Exception as exc:  # noqa: BLE001  (never break the program's import)
        import warnings

        warnings.warn(f"opscope: compiled kernels will not be attributed: {exc}", RuntimeWarning)


def _make_load_callable() -> None:
    """``opscope.load(path_or_store, rank=None, window=None)``: a saved profile with a live
    one's results API (``session_profile.load``); ``opscope.load.read_trace`` and the
    package's other names stay importable as they were."""
    import opscope.load as package

    class CallableLoadPackage(type(package)):
        def __call__(self, path_or_store, rank=None, window=None, **options):
            from opscope.api.session_profile import load

            return load(path_or_store, rank, window, **options)

    CallableLoadPackage.__call__.__doc__ = (
        "opscope.load(path_or_store, rank=None, window=None, *, max_bytes=None): "
        "see opscope.api.session_profile.load")
    package.__class__ = CallableLoadPackage


_make_load_callable()
from opscope.black_box.environment import black_box_requested  # noqa: E402
from opscope.on_demand import enable_from_environment, on_demand_requested  # noqa: E402
from opscope.torch_import import after_torch_import  # noqa: E402

if on_demand_requested():  # OPSCOPE_ON_DEMAND=1: this process answers `opscope trigger`,
    _with_torch()          # enabled at the import, as it always was (this imports torch)
    enable_from_environment()
else:
    after_torch_import(_with_torch)
_install_inductor_notes()
if black_box_requested():  # OPSCOPE_BLACKBOX=1: the black box runs from the import on
    _with_torch()
    from opscope.black_box.environment import start_from_environment

    start_from_environment()
