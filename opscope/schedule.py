"""The profiling schedule: which steps wait, warm up and record.

``schedule()`` returns a callable mapping a step number to a
:class:`ProfilerAction`. ``TRANSITIONS`` is the explicit table from
(previous action, current action) to the steps the profiler takes; ``None``
as the current action means the profiler is exiting.

Example::

    >>> s = schedule(wait=1, warmup=1, active=2)
    >>> [s(i).name for i in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']
"""

from __future__ import annotations

import warnings
from enum import Enum
from typing import Callable, Dict, List, Optional, Tuple


class ProfilerAction(Enum):
    """What the profiler does during a step."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def as_action(value) -> ProfilerAction:
    """Accept our actions and torch.profiler's (same names), e.g. from torch's schedule."""
    if isinstance(value, ProfilerAction):
        return value
    name = getattr(value, "name", None)
    if name in ProfilerAction.__members__:
        return ProfilerAction[name]
    raise TypeError(f"schedule returned {value!r}; expected a ProfilerAction")


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0,
             skip_first: int = 0) -> Callable[[int], ProfilerAction]:
    """Skip ``skip_first`` steps, then cycle wait -> warmup -> active.

    ``repeat`` cycles in all (0: keep cycling). The last active step of a cycle
    is RECORD_AND_SAVE, which hands the trace to ``on_trace_ready``.

    >>> schedule(wait=0, warmup=1, active=1, skip_first=1)(0).name
    'NONE'
    """
    for arg, value in (("wait", wait), ("warmup", warmup), ("active", active),
                       ("repeat", repeat), ("skip_first", skip_first)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"schedule(): {arg} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"schedule(): {arg} must be >= 0, got {value}")
    if active < 1:
        raise ValueError(f"schedule(): active must be >= 1, got {active}")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results")
    cycle = wait + warmup + active

    def action_at(step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError(f"schedule: step must be >= 0, got {step}")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if repeat > 0 and step >= repeat * cycle:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    return action_at


def default_schedule(_step: int) -> ProfilerAction:
    """Without a schedule: record every step, from start to stop."""
    return ProfilerAction.RECORD


# Step names the profiler knows: "prepare", "start", "stop", "ready", and a
# "warn:<message>" step that emits that warning.
_N, _W, _R, _S = (ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
                  ProfilerAction.RECORD_AND_SAVE)
TRANSITIONS: Dict[Tuple[ProfilerAction, Optional[ProfilerAction]], List[str]] = {
    (_N, _N): [],
    (_N, _W): ["prepare"],
    (_N, _R): ["prepare", "start"],
    (_N, _S): ["prepare", "start"],
    (_W, _N): ["warn:Incorrect schedule: WARMUP followed by NONE", "start", "stop"],
    (_W, _W): [],
    (_W, _R): ["start"],
    (_W, _S): ["start"],
    (_R, _N): ["warn:Incorrect schedule: RECORD followed by NONE", "stop"],
    (_R, _W): ["warn:Incorrect schedule: RECORD followed by WARMUP", "stop"],
    (_R, _R): [],
    (_R, _S): [],
    (_S, _N): ["stop", "ready"],
    (_S, _W): ["stop", "ready", "prepare"],
    (_S, _R): ["stop", "ready", "prepare", "start"],
    (_S, _S): ["stop", "ready", "prepare", "start"],
    # exiting the profiler
    (_N, None): [],
    (_W, None): ["start", "stop"],
    (_R, None): ["stop", "ready"],
    (_S, None): ["stop", "ready"],
}
