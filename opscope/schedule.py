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

from opscope.arguments import check_int


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
             skip_first: int = 0, skip_first_wait: int = 0) -> Callable[[int], ProfilerAction]:
    """Skip ``skip_first`` steps, then cycle wait -> warmup -> active.

    ``repeat`` cycles in all (0: keep cycling). The last active step of a cycle
    is RECORD_AND_SAVE, which hands the trace to ``on_trace_ready``. A non-zero
    ``skip_first_wait`` drops the wait phase of the first cycle only (torch's
    flag). Every count is an int; ``active`` >= 1, the others >= 0.

    >>> schedule(wait=0, warmup=1, active=1, skip_first=1)(0).name
    'NONE'
    >>> [schedule(wait=2, warmup=1, active=1, skip_first_wait=1)(i).name for i in range(3)]
    ['WARMUP', 'RECORD_AND_SAVE', 'NONE']
    >>> schedule(wait=1, warmup=1, active=0)
    Traceback (most recent call last):
    ...
    ValueError: schedule: active must be >= 1, got 0
    """
    wait = check_int("schedule", "wait", wait, minimum=0)
    warmup = check_int("schedule", "warmup", warmup, minimum=0)
    active = check_int("schedule", "active", active, minimum=1)
    repeat = check_int("schedule", "repeat", repeat, minimum=0)
    skip_first = check_int("schedule", "skip_first", skip_first, minimum=0)
    # torch reads skip_first_wait as a flag typed int; True/False are accepted too.
    if not isinstance(skip_first_wait, bool):
        skip_first_wait = check_int("schedule", "skip_first_wait", skip_first_wait, minimum=0)
    shift = wait if skip_first_wait else 0
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results",
                      stacklevel=2)
    cycle = wait + warmup + active

    def action_at(step: int) -> ProfilerAction:
        step = check_int("schedule", "step", step, minimum=0)
        if step < skip_first:
            return ProfilerAction.NONE
        step = step - skip_first + shift
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


# torch.profiler's words, said once per process when a new cycle begins without acc_events
NEW_CYCLE_WARNING = ("Warning: Profiler clears events at the end of each cycle. Only events "
                     "from the current cycle will be reported. To keep events across cycles, "
                     "set acc_events=True.")
_warned: set = set()


def warn_once(message: str) -> None:
    """``warnings.warn(message)`` the first time in this process, as torch's ``_warn_once``."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=5)  # the profiler's step() or start()


# Step names the profiler knows: "prepare", "start", "stop", "ready", and a
# "warn:<message>" step that emits that warning. The profiler maps each name to
# a method (``opscope.profile._STEPS``). An output step that fails ("stop" writing
# the execution trace, "ready") does not skip the steps after it.
STEP_NAMES: Tuple[str, ...] = ("prepare", "start", "stop", "ready")
OUTPUT_STEPS: Tuple[str, ...] = ("stop", "ready")
WARN_PREFIX = "warn:"
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
