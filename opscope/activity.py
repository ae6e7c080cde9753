"""Activities and device types, with torch's own enums so values compare equal.

Example::

    >>> ProfilerActivity.CPU in supported_activities()
    True
"""

from __future__ import annotations

import warnings
from typing import Iterable, Optional, Set

from torch.autograd import DeviceType  # noqa: F401  (re-exported)
from torch.profiler import ProfilerActivity


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


def resolve_activities(activities: Optional[Iterable[ProfilerActivity]],
                       use_cuda: Optional[bool] = None) -> Set[ProfilerActivity]:
    """The activities to record; unsupported ones are dropped with a warning."""
    wanted = set(activities) if activities else supported_activities()
    if use_cuda is not None:
        warnings.warn("use_cuda is deprecated, use activities argument instead",
                      stacklevel=3)
        if use_cuda:
            wanted.add(ProfilerActivity.CUDA)
        else:
            wanted.discard(ProfilerActivity.CUDA)
    for item in wanted:
        if not isinstance(item, ProfilerActivity):
            raise TypeError(f"activities: expected ProfilerActivity values, got {item!r}")
    if not wanted:
        raise ValueError("activities: no profiler activities given; pass e.g. "
                         "[ProfilerActivity.CPU]")
    available = supported_activities()
    missing = wanted - available
    if missing:
        names = ", ".join(sorted(a.name for a in missing))
        warnings.warn(f"opscope cannot record {names} activity on this machine; "
                      "recording the rest", RuntimeWarning, stacklevel=3)
    return (wanted & available) or {ProfilerActivity.CPU}
