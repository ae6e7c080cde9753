"""Activities and device types, with torch's own enums so values compare equal.

Example::

    >>> ProfilerActivity.CPU in supported_activities()
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable as IterableABC, Mapping
from typing import Any, Dict, Iterable, Optional, Set, Tuple

from torch.autograd import DeviceType  # noqa: F401  (re-exported)
from torch.profiler import ProfilerActivity

from opscope.arguments import check_bool
from opscope.configs import check_cuspy_has_cpu, checked_activity_config


def supported_activities() -> Set[ProfilerActivity]:
    """Activities opscope can record on this machine: CPU, plus CUDA when available.

    opscope records device activity only through torch's allocator and CUDA
    events; CPU op collection is ours.
    """
    found = {ProfilerActivity.CPU}
    try:
        import torch

        if torch.cuda.is_available():
            found.add(ProfilerActivity.CUDA)
    except Exception:
        pass
    return found


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _wanted_activities(where: str, activities: Any) -> Tuple[Set[ProfilerActivity], Dict]:
    """``activities`` as a set plus per-activity configs, checked item by item.

    An item is a ``ProfilerActivity`` or (torch 2.15's form) a dict from activity
    to a ``ProfilerActivityConfig``, a list of activity type names, or None.
    """
    expected = ("an iterable of ProfilerActivity or {ProfilerActivity: ProfilerActivityConfig} "
                "dicts (e.g. [ProfilerActivity.CPU])")
    # A str or a mapping is iterable, but never what the caller meant.
    if (not isinstance(activities, IterableABC) or isinstance(activities, (str, bytes, Mapping))
            or isinstance(activities, ProfilerActivity)):
        raise TypeError(f"{where}: activities must be {expected}, "
                        f"got {type(activities).__name__} {_short_repr(activities)}")
    wanted: Set[ProfilerActivity] = set()
    configs: Dict[ProfilerActivity, Any] = {}
    for item in activities:
        if isinstance(item, ProfilerActivity):
            # A repeated bare activity is fine, as in torch < 2.15 (it made a set);
            # one that also has a config is ambiguous, as torch 2.15 says.
            if item in configs:
                raise ValueError(f"{where}: activities: {item} specified more than once")
            wanted.add(item)
        elif isinstance(item, Mapping):
            for key, value in item.items():
                if not isinstance(key, ProfilerActivity):
                    raise TypeError(f"{where}: activities: a dict's keys must be "
                                    f"ProfilerActivity, got {type(key).__name__} "
                                    f"{_short_repr(key)}")
                if key in wanted:
                    raise ValueError(f"{where}: activities: {key} specified more than once")
                wanted.add(key)
                configs[key] = checked_activity_config(where, key, value)
        else:
            raise TypeError(f"{where}: activities must be {expected}, but it holds "
                            f"{type(item).__name__} {_short_repr(item)}")
    check_cuspy_has_cpu(where, wanted, configs)
    return wanted, configs


def resolve_activities(activities: Optional[Iterable[Any]],
                       use_cuda: Optional[bool] = None,
                       where: str = "profile") -> Set[ProfilerActivity]:
    """The activities to record; unsupported ones are dropped with a warning.

    None or an empty iterable means every supported activity, as in torch.
    Anything but an iterable of ``ProfilerActivity`` (or of torch 2.15's
    ``{activity: ProfilerActivityConfig}`` dicts) is a TypeError naming
    ``activities``. ``resolve_activity_configs`` also gives the configs.

    >>> resolve_activities([ProfilerActivity.CPU])
    {<ProfilerActivity.CPU: 0>}
    >>> resolve_activities([{ProfilerActivity.CPU: None}])
    {<ProfilerActivity.CPU: 0>}
    >>> resolve_activities(5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: profile: activities must be an iterable of ProfilerActivity or ..., got int 5
    """
    return resolve_activity_configs(activities, use_cuda, where)[0]


def resolve_activity_configs(activities: Optional[Iterable[Any]],
                             use_cuda: Optional[bool] = None,
                             where: str = "profile") -> Tuple[Set[ProfilerActivity], Dict]:
    """``resolve_activities`` plus the ``ProfilerActivityConfig`` given per activity.

    The configs are kept for every activity asked for, recorded or not (opscope
    keeps them in the trace metadata; see ``opscope.configs``).

    >>> from opscope.configs import ProfilerActivityConfig
    >>> wanted, configs = resolve_activity_configs(
    ...     [{ProfilerActivity.CPU: ProfilerActivityConfig(activity_types=["cpu_op"])}])
    >>> wanted, configs[ProfilerActivity.CPU].activity_types
    ({<ProfilerActivity.CPU: 0>}, ['cpu_op'])
    """
    wanted, configs = (set(), {}) if activities is None else _wanted_activities(where, activities)
    if use_cuda is not None:
        use_cuda = check_bool(where, "use_cuda", use_cuda)
    if not wanted:
        wanted = supported_activities()
    if use_cuda is not None:
        warnings.warn("use_cuda is deprecated, use activities argument instead",
                      stacklevel=3)
        if use_cuda:
            wanted.add(ProfilerActivity.CUDA)
        else:
            wanted.discard(ProfilerActivity.CUDA)
    if not wanted:
        raise ValueError(f"{where}: activities: no profiler activities left (use_cuda=False "
                         "removed CUDA); pass e.g. [ProfilerActivity.CPU]")
    available = supported_activities()
    missing = wanted - available
    if missing:
        names = ", ".join(sorted(a.name for a in missing))
        warnings.warn(f"opscope cannot record {names} activity on this machine; "
                      "recording the rest", RuntimeWarning, stacklevel=3)
    return (wanted & available) or {ProfilerActivity.CPU}, configs
