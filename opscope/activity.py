"""Activities and device types, with torch's own enums so values compare equal.

Example::

    >>> ProfilerActivity.CPU in supported_activities()
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable as IterableABC, Mapping
from typing import Any, Iterable, Optional, Set

from torch.autograd import DeviceType  # noqa: F401  (re-exported)
from torch.profiler import ProfilerActivity

from opscope.arguments import check_bool


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


def _wanted_activities(where: str, activities: Any) -> Set[ProfilerActivity]:
    """``activities`` as a set, checked item by item; empty or None means the default."""
    expected = "an iterable of ProfilerActivity (e.g. [ProfilerActivity.CPU])"
    # A str or a mapping is iterable, but never what the caller meant.
    if (not isinstance(activities, IterableABC) or isinstance(activities, (str, bytes, Mapping))
            or isinstance(activities, ProfilerActivity)):
        raise TypeError(f"{where}: activities must be {expected}, "
                        f"got {type(activities).__name__} {_short_repr(activities)}")
    wanted = set()
    for item in activities:
        if not isinstance(item, ProfilerActivity):
            raise TypeError(f"{where}: activities must be {expected}, but it holds "
                            f"{type(item).__name__} {_short_repr(item)}")
        wanted.add(item)
    return wanted


def resolve_activities(activities: Optional[Iterable[ProfilerActivity]],
                       use_cuda: Optional[bool] = None,
                       where: str = "profile") -> Set[ProfilerActivity]:
    """The activities to record; unsupported ones are dropped with a warning.

    None or an empty iterable means every supported activity, as in torch.
    Anything but an iterable of ``ProfilerActivity`` is a TypeError naming
    ``activities``.

    >>> resolve_activities([ProfilerActivity.CPU])
    {<ProfilerActivity.CPU: 0>}
    >>> resolve_activities(5)
    Traceback (most recent call last):
    ...
    TypeError: profile: activities must be an iterable of ProfilerActivity (e.g. [ProfilerActivity.CPU]), got int 5
    """
    wanted = set() if activities is None else _wanted_activities(where, activities)
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
    return (wanted & available) or {ProfilerActivity.CPU}
