"""Build the profiler a verb runs: collector warm-up, schedule, flags.

Example::

    >>> from opscope.cli.options import ScheduleSpec
    >>> sched = make_schedule(ScheduleSpec(1, 1, 2, 1))
    >>> [sched(i).name for i in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Callable, Dict, Optional

import opscope
from opscope.collect import COLLECTOR_ENV, requested_collector
from opscope.cli.errors import UsageError
from opscope.cli.options import ScheduleSpec
from opscope.cli.progress import progress


# command-line flag -> (opscope.profile keyword, help)
PROFILE_FLAGS: Dict[str, tuple] = {
    "--record-shapes": ("record_shapes", "record input shapes of each op"),
    "--memory": ("profile_memory", "record tensor memory allocated and freed by each op: "
                                   "the table's CPU Mem is the bytes allocated minus freed "
                                   "while it ran, what it called included"),
    "--stack": ("with_stack", "record the Python stack of each op"),
    "--modules": ("with_modules", "record the nn.Module hierarchy of each op"),
    "--flops": ("with_flops", "estimate FLOPs of matrix products, convolutions (and their "
                              "backward), attention, add and mul"),
}


def add_profile_flags(parser: argparse.ArgumentParser) -> None:
    """The on/off flags that map to ``opscope.profile`` keywords."""
    group = parser.add_argument_group("what to record")
    for flag, (keyword, text) in PROFILE_FLAGS.items():
        group.add_argument(flag, dest=keyword, action="store_true", help=f"{text} ({keyword}=True)")


def profile_kwargs(args: argparse.Namespace) -> Dict[str, bool]:
    """``opscope.profile`` keywords from the parsed flags.

    >>> profile_kwargs(argparse.Namespace(record_shapes=True))["record_shapes"]
    True
    """
    return {keyword: bool(getattr(args, keyword, False)) for keyword, _ in PROFILE_FLAGS.values()}


def make_schedule(spec: Optional[ScheduleSpec]) -> Optional[Callable[[int], Any]]:
    """``opscope.schedule`` for ``spec``; its warnings become one ``opscope: warning:`` line."""
    if spec is None:
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched = opscope.schedule(wait=spec.wait, warmup=spec.warmup, active=spec.active,
                                 repeat=spec.repeat)
    for w in caught:
        print(f"opscope: warning: --schedule: {w.message}", file=sys.stderr)
    return sched


def warm_up_collector() -> None:
    """Load (first use: compile) the collector now, so the program is not paused for it later."""
    try:
        wanted = requested_collector()
    except ValueError as exc:
        raise UsageError(f"environment variable {exc}") from None
    if wanted == "python":
        return
    with progress("loading the native collector (compiled on first use)"):
        available = opscope.kineto_available()
    if not available and wanted == "native":
        from opscope.collect.native.build import failure_reason

        raise UsageError(f"{COLLECTOR_ENV}=native but the native collector is unavailable "
                         f"({failure_reason()}); unset it to use the Python fallback")


def start_profiler(prof: Any) -> None:
    """``prof.start()``, with collector problems reported as usage errors."""
    try:
        prof.start()
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"cannot start the profiler: {exc}") from None
