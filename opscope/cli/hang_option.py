"""``opscope run --hang-after S``: the live hang detector of a torchrun job, and its writes.

In a job of several ranks, ``opscope run`` turns torch's flight recorder on
(``TORCH_FR_BUFFER_SIZE=2000`` unless the user set it) and starts a
:class:`~opscope.on_demand.hang.HangWatch` on every rank. When a hang is
reported, each rank writes what it recorded so far, as torchrun's SIGTERM
would (a window cut short, its trace's ``opscopeHang`` entry marked
``"partial": true``), and records nothing more; the job goes on, left to its
process group's timeout. The profiler's step and that write take turns
(:class:`StepGuard`), so a rank that is still running is never cut inside a
step.

Example::

    >>> parse_hang_after("2.5"), parse_hang_after("0")
    (2.5, 0.0)
    >>> parse_hang_after("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected seconds >= 0 (0 turns hang detection off); got '-1'
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from typing import Any, Callable, Optional

from opscope.collect.job.live_collectives import BUFFER_ENV, enable_flight_recorder
from opscope.on_demand.hang import DEFAULT_HANG_AFTER_S, HANG_FILE, HANG_KEY, HangWatch

WRITE_WAIT_S = 30.0  # the most a write at a hang waits for the profiler's step to end


def parse_hang_after(text: str) -> float:
    """``--hang-after``: seconds >= 0, finite."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"expected seconds >= 0 (0 turns hang detection off); got {text!r}")
    return value


def add_hang_option(parser: argparse.ArgumentParser) -> None:
    """``--hang-after S``."""
    parser.add_argument(
        "--hang-after", metavar="S", type=parse_hang_after, default=DEFAULT_HANG_AFTER_S,
        help=f"in a job of several ranks, report a collective that some rank has entered and "
             f"another has not for S seconds, while the job hangs: one line on rank 0 and "
             f"DIR/{HANG_FILE}; every rank then writes what it recorded (default: "
             f"{DEFAULT_HANG_AFTER_S:g}; 0: off)")


class StepGuard:
    """The profiler's step and a write at a hang, one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def run(self, func: Callable[[], None]) -> None:
        """``func()`` while no write at a hang is under way."""
        with self._lock:
            func()

    def try_run(self, func: Callable[[], None], wait_s: float = WRITE_WAIT_S) -> bool:
        """``func()`` once the step is done, if within ``wait_s``; whether it ran."""
        if not self._lock.acquire(timeout=wait_s):
            return False
        try:
            func()
        finally:
            self._lock.release()
        return True


def start_hang_watch(args: argparse.Namespace, folder: str, rank: Optional[int], who: str,
                     prof: Any, writer: Any, guard: StepGuard) -> Optional[HangWatch]:
    """Start this rank's HangWatch (None: not a job of several ranks, or ``--hang-after 0``).

    Call it before the script creates its process group: torch reads the
    recorder's size then.
    """
    if rank is None or not args.hang_after:
        return None
    if not enable_flight_recorder():
        if rank == 0:
            print(f"{who}hang detection is off: it reads torch's flight recorder, which "
                  f"{BUFFER_ENV}=0 turns off", file=sys.stderr)
        return None

    def write_so_far() -> None:
        written, errors = len(writer.written), len(writer.errors)

        def stop() -> None:
            prof.add_metadata_json(HANG_KEY, json.dumps(
                {"partial": True, "ended_by": "a hang was reported", "report": HANG_FILE}))
            writer.stopping = True
            prof.stop()

        if not guard.try_run(stop):
            print(f"{who}a hang was reported, but the profiler's step did not end within "
                  f"{WRITE_WAIT_S:g} s: nothing written now", file=sys.stderr, flush=True)
            return
        lines = writer.written[written:] + [f"error: {e}" for e in writer.errors[errors:]]
        for line in lines or ["nothing recorded to write"]:
            print(f"{who}at the hang: {line}", file=sys.stderr, flush=True)

    return HangWatch.start(folder, args.output_dir, args.hang_after, on_hang=write_so_far)
