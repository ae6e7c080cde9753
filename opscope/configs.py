"""torch 2.15's per-activity configs: ``ProfilerActivityConfig`` and its extensions.

torch 2.15 lets ``activities`` hold dicts, ``{ProfilerActivity.CUDA:
ProfilerActivityConfig(profiler_configs=[CuspyConfig()])}``, besides bare
activities. opscope defines the same classes with the same fields on every torch
version, and accepts torch's own instances where the installed torch has them.
The extensions (Cuspy, hardware performance metrics) configure device backends
opscope does not run; ``configs_metadata`` turns what was asked into JSON for
the trace's metadata, so the request is kept and visible.

Example::

    >>> cfg = ProfilerActivityConfig(profiler_configs=[PerformanceMetricsConfig(["sm__x"])])
    >>> cfg._get_profiler_config(PerformanceMetricsConfig).metric_names
    ['sm__x']
    >>> cfg._get_profiler_config(CuspyConfig) is None
    True
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable as IterableABC, Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar

__all__ = ["CuspyConfig", "PerformanceMetricsConfig", "ProfilerActivityConfig"]


class _ProfilerExtensionConfig(ABC):
    """A device-backend extension config, serialised as key-value entries (as torch's)."""

    @abstractmethod
    def _to_config_entries(self) -> Dict[str, str]:
        """The entries torch hands its backend; kept in opscope's metadata only."""


_ConfigT = TypeVar("_ConfigT")


@dataclass(frozen=True)
class CuspyConfig(_ProfilerExtensionConfig):
    """torch 2.15's Cuspy CUDA collection options; opscope records them, runs no Cuspy.

    >>> CuspyConfig(enable_cuda_sync_events=True).enable_cuda_sync_events
    True
    """

    enable_cuda_sync_events: bool = False
    enable_environment_counters: bool = False
    enable_graph_dependencies: bool = False
    enable_event_node_ids: bool = False

    def _to_config_entries(self) -> Dict[str, str]:
        return {}


@dataclass
class PerformanceMetricsConfig(_ProfilerExtensionConfig):
    """torch 2.15's hardware counter options (``metric_names`` is required).

    >>> PerformanceMetricsConfig(["a", "b"], sampling_interval_ms=2.0)._to_config_entries()
    {'PERFORMANCE_METRICS': 'a,b', 'PERFORMANCE_METRICS_SAMPLING_INTERVAL_MS': '2.0'}
    """

    metric_names: List[str]
    sampling_interval_ms: Optional[float] = None
    lookback_window_ms: Optional[float] = None

    def _to_config_entries(self) -> Dict[str, str]:
        entries = {"PERFORMANCE_METRICS": ",".join(self.metric_names)}
        if self.sampling_interval_ms is not None:
            entries["PERFORMANCE_METRICS_SAMPLING_INTERVAL_MS"] = str(self.sampling_interval_ms)
        if self.lookback_window_ms is not None:
            entries["PERFORMANCE_METRICS_LOOKBACK_WINDOW_MS"] = str(self.lookback_window_ms)
        return entries


@dataclass
class ProfilerActivityConfig:
    """What to collect for one activity: ``activity_types`` (None: the defaults)
    and extension ``profiler_configs`` (``CuspyConfig``, ``PerformanceMetricsConfig``).

    >>> ProfilerActivityConfig().activity_types is None
    True
    """

    activity_types: Optional[List[str]] = None
    profiler_configs: List[Any] = field(default_factory=list)

    def _get_profiler_config(self, config_type: Type[_ConfigT]) -> Optional[_ConfigT]:
        """The first of ``profiler_configs`` that is a ``config_type``, or None."""
        return next((c for c in self.profiler_configs if isinstance(c, config_type)), None)


def _torch_classes(name: str) -> tuple:
    """torch's class of that name, where the installed torch has one (2.15+)."""
    try:
        import torch.profiler.profiler as torch_profiler
    except Exception:
        return ()
    cls = getattr(torch_profiler, name, None)
    return (cls,) if isinstance(cls, type) else ()


def is_activity_config(value: Any) -> bool:
    """True for an opscope or a torch ``ProfilerActivityConfig``."""
    return isinstance(value, (ProfilerActivityConfig,) + _torch_classes("ProfilerActivityConfig"))


def is_extension_config(value: Any) -> bool:
    """True for an opscope or a torch extension config (Cuspy, performance metrics)."""
    return isinstance(value, (_ProfilerExtensionConfig,)
                      + _torch_classes("_ProfilerExtensionConfig"))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def checked_activity_config(where: str, activity: Any, value: Any) -> Any:
    """A dict item's value as a config: a config is checked, a list of type names or
    None is wrapped in ``ProfilerActivityConfig`` (as torch does)."""
    name = f"activities[{activity}]"
    if not is_activity_config(value):
        if value is not None and (isinstance(value, (str, bytes, Mapping))
                                  or not isinstance(value, IterableABC)):
            raise TypeError(f"{where}: {name} must be a ProfilerActivityConfig, a list of "
                            f"activity type names or None, got {type(value).__name__} "
                            f"{_short(value)}")
        value = ProfilerActivityConfig(activity_types=None if value is None else list(value))
    types = value.activity_types
    if types is not None:
        if isinstance(types, (str, bytes)) or not isinstance(types, IterableABC):
            raise TypeError(f"{where}: {name}.activity_types must be a list of str or None, "
                            f"got {type(types).__name__} {_short(types)}")
        bad = [t for t in types if not isinstance(t, str)]
        if bad:
            raise TypeError(f"{where}: {name}.activity_types must hold only str, but it "
                            f"holds {type(bad[0]).__name__} {_short(bad[0])}")
    configs = value.profiler_configs
    if isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, IterableABC):
        raise TypeError(f"{where}: {name}.profiler_configs must be a list of configs, got "
                        f"{type(configs).__name__} {_short(configs)}")
    for config in configs:
        if not is_extension_config(config):
            raise TypeError(f"{where}: {name}.profiler_configs must hold CuspyConfig or "
                            f"PerformanceMetricsConfig, but it holds "
                            f"{type(config).__name__} {_short(config)}")
    return value


def _config_json(config: Any) -> Dict[str, Any]:
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    return {"type": type(config).__name__, **fields}


def configs_metadata(configs: Mapping) -> Optional[str]:
    """JSON for the trace metadata: each activity's config, or None when there is none.

    >>> from torch.profiler import ProfilerActivity
    >>> configs_metadata({ProfilerActivity.CUDA: ProfilerActivityConfig(
    ...     profiler_configs=[CuspyConfig()])})[:52]
    '{"CUDA": {"activity_types": null, "profiler_configs"'
    """
    if not configs:
        return None
    out = {}
    for activity, config in configs.items():
        out[getattr(activity, "name", str(activity))] = {
            "activity_types": (None if config.activity_types is None
                               else list(config.activity_types)),
            "profiler_configs": [_config_json(c) for c in config.profiler_configs],
        }
    return json.dumps(out, sort_keys=True, default=str)


# The trace metadata key that keeps the configs opscope did not apply.
CONFIGS_METADATA_KEY = "profilerActivityConfigs"


def _is_default(config: Any) -> bool:
    return config.activity_types is None and not list(config.profiler_configs)


def unapplied_configs_metadata(where: str, configs: Mapping) -> Optional[str]:
    """JSON of the configs opscope does not apply, for the trace metadata; or None.

    opscope records every CPU event and runs no device backend, so any config
    other than the default is kept as metadata only. A CPU ``activity_types``
    filter warns once, since the recording then holds more than asked.

    >>> from torch.profiler import ProfilerActivity
    >>> unapplied_configs_metadata("profile", {ProfilerActivity.CPU: ProfilerActivityConfig()})
    """
    import warnings

    kept = {activity: config for activity, config in configs.items() if not _is_default(config)}
    for activity, config in kept.items():
        if getattr(activity, "name", "") == "CPU" and config.activity_types is not None:
            warnings.warn(f"{where}: opscope records every CPU event; activities' CPU "
                          f"activity_types {list(config.activity_types)!r} is kept in the "
                          f"trace metadata ({CONFIGS_METADATA_KEY}) only", RuntimeWarning,
                          stacklevel=3)
    return configs_metadata(kept)


def check_cuspy_has_cpu(where: str, wanted: Any, configs: Mapping) -> None:
    """torch 2.15's rule: a CUDA ``CuspyConfig`` needs the CPU activity too.

    >>> from torch.profiler import ProfilerActivity
    >>> check_cuspy_has_cpu("profile", {ProfilerActivity.CUDA}, {ProfilerActivity.CUDA:
    ...     ProfilerActivityConfig(profiler_configs=[CuspyConfig()])})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: profile: activities: CuspyConfig needs ProfilerActivity.CPU in activities too ...
    """
    cuda = next((c for a, c in configs.items() if getattr(a, "name", "") == "CUDA"), None)
    if cuda is None or any(getattr(a, "name", "") == "CPU" for a in wanted):
        return
    if any(type(c).__name__ == "CuspyConfig" for c in cuda.profiler_configs):
        raise ValueError(f"{where}: activities: CuspyConfig needs ProfilerActivity.CPU in "
                         "activities too (Cuspy merges its trace with the CPU trace)")
