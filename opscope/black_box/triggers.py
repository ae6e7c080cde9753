"""When the black box writes: the step rules, and the exception and signal hooks.

``StepWatch`` turns optimizer steps into the two step reasons:

- ``slow_step``: a step (from one ``optimizer.step()`` to the next) longer
  than ``slow_step`` times the median of the last 20 steps, once at least 5
  are known; at most one such dump a minute.
- ``stall``: no step finished for ``slow_step`` times the median step and at
  least 10 s; said once per stall (a step re-arms it).

``Hooks`` chains ``sys.excepthook`` and ``threading.excepthook`` (an
uncaught exception in any thread; the hooks that were there still run) and,
from the main thread, handles SIGTERM and SIGINT: it calls ``on_fatal``,
then does what was there before (a Python handler is called; the default
action is taken again, so the process ends by the signal, as it would have).

Example::

    >>> clock = iter(k * 10 ** 9 for k in [0, 1, 2, 3, 4, 5, 6, 16]).__next__
    >>> watch = StepWatch(slow_step=3.0, clock=clock)
    >>> [watch.on_step() for _ in range(7)]
    [None, None, None, None, None, None, None]
    >>> slow = watch.on_step()            # 10 s after six 1 s steps
    >>> slow["step_ns"], slow["median_ns"], slow["rule"]
    (10000000000, 1000000000, 'a step longer than 3 x the median of the last 20 steps')
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional

HISTORY_STEPS = 20
MIN_STEPS = 5
SLOW_DUMP_EVERY_S = 60.0
STALL_MIN_S = 10.0
SIGNALS = ("SIGTERM", "SIGINT")


class StepWatch:
    """Step ends on the monotonic clock (ns); the slow-step and stall rules.

    Called from every ``optimizer.step()``, so a step costs a few list operations:
    the last steps' durations are kept beside their ends, and sorted only for the median.
    """

    def __init__(self, slow_step: float, clock: Callable[[], int] = time.monotonic_ns):
        self.slow_step = float(slow_step)
        self._clock = clock
        self._ends: Deque[int] = deque(maxlen=HISTORY_STEPS + 1)
        self._durations: Deque[int] = deque(maxlen=HISTORY_STEPS)  # between those ends
        self._last_slow_ns: Optional[int] = None
        self._stall_said = False

    @property
    def rule(self) -> str:
        return f"a step longer than {self.slow_step:g} x the median of the last " \
               f"{HISTORY_STEPS} steps"

    def on_step(self) -> Optional[Dict[str, Any]]:
        """A step ended now; the slow step's facts when the rule fires, else None."""
        now = self._clock()
        self._stall_said = False
        ends = self._ends
        fired = None
        if ends:
            took = now - ends[-1]
            if len(ends) > MIN_STEPS:
                median = _median(self._durations)
                if took > self.slow_step * median and not (
                        self._last_slow_ns is not None
                        and now - self._last_slow_ns < SLOW_DUMP_EVERY_S * 1e9):
                    self._last_slow_ns = now
                    fired = {"rule": self.rule, "step_ns": took, "median_ns": int(median),
                             "slow_step": [ends[-1], now],
                             "typical_step": self._typical_step(median)}
            self._durations.append(took)
        ends.append(now)
        return fired

    def stalled(self) -> Optional[Dict[str, Any]]:
        """The stall's facts when no step ended for the stall time (once per stall)."""
        ends = self._ends
        if self._stall_said or len(ends) <= MIN_STEPS:
            return None
        median = _median(self._durations)
        limit = max(STALL_MIN_S * 1e9, self.slow_step * median)
        waited = self._clock() - ends[-1]
        if waited < limit:
            return None
        self._stall_said = True
        return {"rule": f"no step for {self.slow_step:g} x the median step and at least "
                        f"{STALL_MIN_S:g} s", "waited_ns": int(waited), "median_ns": int(median)}

    def _typical_step(self, median: float) -> List[int]:
        """[start, end] of the known step whose duration is nearest the median."""
        ends = list(self._ends)
        k = min(range(len(ends) - 1), key=lambda i: abs(ends[i + 1] - ends[i] - median))
        return [ends[k], ends[k + 1]]


def _median(durations: Deque[int]) -> float:
    """The median, as ``statistics.median`` gives it (the mean of the middle two)."""
    ordered = sorted(durations)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


class Hooks:
    """The exception hooks and signal handlers that call ``on_fatal(reason, facts)``."""

    def __init__(self, on_fatal: Callable[[str, Dict[str, Any]], None]):
        self._on_fatal = on_fatal
        self._owner = os.getpid()
        self._previous: Dict[Any, Any] = {}
        self._in_signal = False

    def install(self) -> None:
        self._previous["sys"] = sys.excepthook
        self._previous["threading"] = threading.excepthook
        sys.excepthook = self._sys_hook
        threading.excepthook = self._thread_hook
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for name in SIGNALS:
            number = getattr(signal, name)
            try:
                self._previous[number] = signal.signal(number, self._on_signal)
            except (ValueError, OSError):  # not settable here: that signal is not watched
                pass

    def uninstall(self) -> None:
        if sys.excepthook == self._sys_hook:
            sys.excepthook = self._previous.get("sys", sys.__excepthook__)
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._previous.get("threading", threading.__excepthook__)
        for number, previous in list(self._previous.items()):
            if isinstance(number, str):
                continue
            try:
                if signal.getsignal(number) == self._on_signal:
                    signal.signal(number, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
        self._previous.clear()

    def _mine(self) -> bool:
        return os.getpid() == self._owner  # a forked child has no black box

    def _sys_hook(self, kind, value, tb) -> None:
        if self._mine() and not issubclass(kind, KeyboardInterrupt):
            self._on_fatal("exception", _exception_facts(kind, value, "MainThread"))
        self._previous.get("sys", sys.__excepthook__)(kind, value, tb)

    def _thread_hook(self, args) -> None:
        if self._mine() and not issubclass(args.exc_type, SystemExit):
            name = getattr(args.thread, "name", "?")
            self._on_fatal("exception", _exception_facts(args.exc_type, args.exc_value, name))
        self._previous.get("threading", threading.__excepthook__)(args)

    def _on_signal(self, number: int, frame) -> None:
        previous = self._previous.get(number, signal.SIG_DFL)
        if self._mine() and not self._in_signal:
            self._in_signal = True
            try:
                self._on_fatal("signal", {"signal": signal.Signals(number).name})
            finally:
                self._in_signal = False
        _run_previous(number, previous, frame)


def _run_previous(number: int, previous: Any, frame) -> None:
    """Do what the signal did before: call a Python handler, or die by its default."""
    if callable(previous):
        previous(number, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)


def _exception_facts(kind, value, thread: str) -> Dict[str, Any]:
    text = " ".join(f"{getattr(kind, '__name__', kind)}: {value}".split())
    return {"exception": text[:500], "thread": thread}

