"""A process-wide training step count, fed by every ``optimizer.step()``.

Several things can say "a step happened": the profiler's ``step()``, and
each optimizer. Counting every call would double count (two optimizers, or
an optimizer plus ``prof.step()``, in one iteration), so, like torch's
``KinetoStepTracker``, each *requester* keeps its own count and the global
step is the largest of them. Every optimizer is its own requester
(``Optimizer#1``, ``Optimizer#2``, ...), so a model with two optimizers
still counts one step per iteration.

``track_optimizer_steps()`` installs one global optimizer post-hook (once
per process) that feeds the tracker. Listeners added with
``StepTracker.add_listener`` are called with the new global step each time
it grows; on-demand profiling counts its steps that way.

Example::

    >>> StepTracker.init_step_count("demo")
    >>> before = StepTracker.current_step()
    >>> StepTracker.increment_step("demo") == before + 1
    True
    >>> StepTracker.erase_step_count("demo")
    True
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional

from torch.compiler import is_compiling

PROFILER_REQUESTER = "ProfilerStep"

StepListener = Callable[[int], None]


class StepTracker:
    """Step counts per requester; the global step is the maximum of them.

    The class itself is the tracker (one per process), as torch's
    ``KinetoStepTracker``: all methods are classmethods.

    >>> StepTracker.init_step_count("a"); StepTracker.init_step_count("b")
    >>> start = StepTracker.current_step()
    >>> _ = StepTracker.increment_step("a"); _ = StepTracker.increment_step("b")
    >>> StepTracker.current_step() - start   # a and b stepped together: one step
    1
    >>> StepTracker.erase_step_count("a"), StepTracker.erase_step_count("b")
    (True, True)
    """

    _lock = threading.Lock()
    _current_step = 0
    _step_dict: Dict[str, int] = {}
    _listeners: Dict[int, StepListener] = {}
    _listener_ids = itertools.count(1)

    @classmethod
    def init_step_count(cls, requester: str) -> None:
        """Start counting for ``requester`` from the current global step."""
        with cls._lock:
            cls._step_dict[requester] = cls._current_step

    @classmethod
    def erase_step_count(cls, requester: str) -> bool:
        """Stop counting for ``requester``; False when it was not counted."""
        with cls._lock:
            return cls._step_dict.pop(requester, None) is not None

    @classmethod
    def increment_step(cls, requester: str) -> int:
        """Count one step for ``requester``; returns the global step afterwards.

        When the global step grows, every listener is called with it (once
        per step it grew by). An unknown requester starts from the current
        global step.
        """
        with cls._lock:
            count = cls._step_dict.get(requester, cls._current_step) + 1
            cls._step_dict[requester] = count
            previous = cls._current_step
            if count <= previous:
                return previous
            cls._current_step = count
            listeners = list(cls._listeners.values())
        if count - previous > 1:
            warnings.warn(f"opscope step count grew by {count - previous} at once (from "
                          f"{previous} to {count}); requesters: {dict(cls._step_dict)}",
                          stacklevel=2)
        for step in range(previous + 1, count + 1):
            for listener in listeners:
                _notify(listener, step)
        return count

    @classmethod
    def current_step(cls) -> int:
        """The global step: the largest count of any requester so far."""
        return cls._current_step

    @classmethod
    def add_listener(cls, listener: StepListener) -> int:
        """Call ``listener(step)`` whenever the global step grows; returns an id for removal."""
        if not callable(listener):
            raise TypeError(f"StepTracker.add_listener: listener must be callable, "
                            f"got {listener!r}")
        with cls._lock:
            key = next(cls._listener_ids)
            cls._listeners[key] = listener
        return key

    @classmethod
    def remove_listener(cls, key: int) -> bool:
        """Remove a listener by the id ``add_listener`` returned."""
        with cls._lock:
            return cls._listeners.pop(key, None) is not None


def _notify(listener: StepListener, step: int) -> None:
    # a listener runs inside optimizer.step(): its failure must not end the training
    try:
        listener(step)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"opscope step listener {listener!r} failed at step {step}: "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)


# torch's name, for code written against torch.autograd.profiler.KinetoStepTracker
KinetoStepTracker = StepTracker


# -- the global optimizer post-hook ----------------------------------------------------------
_hook_lock = threading.Lock()
_hook_handle: Optional[Any] = None
_requesters: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_optimizer_numbers = itertools.count(1)


def _requester_of(optimizer: Any) -> str:
    name = _requesters.get(optimizer)
    if name is None:
        name = f"Optimizer#{next(_optimizer_numbers)}"
        _requesters[optimizer] = name
        with StepTracker._lock:
            # Seen at its first step. If another optimizer already counted this
            # iteration, the new one joins it (one behind), so a model with two
            # optimizers does not count its first iteration twice.
            others = any(k.startswith("Optimizer#") for k in StepTracker._step_dict)
            current = StepTracker._current_step
            StepTracker._step_dict[name] = current - 1 if others and current > 0 else current
        weakref.finalize(optimizer, StepTracker.erase_step_count, name)
    return name


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    # torch.compile tracing an optimizer step must not bake the count into a graph
    if is_compiling():
        return
    StepTracker.increment_step(_requester_of(optimizer))


def track_optimizer_steps() -> None:
    """Install the global optimizer post-hook that counts steps (idempotent).

    >>> import torch
    >>> track_optimizer_steps()
    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    >>> before = StepTracker.current_step()
    >>> opt.step(); StepTracker.current_step() - before
    1
    """
    global _hook_handle
    with _hook_lock:
        if _hook_handle is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _hook_handle = register_optimizer_step_post_hook(_on_optimizer_step)


def untrack_optimizer_steps() -> None:
    """Remove the global optimizer post-hook, if installed."""
    global _hook_handle
    with _hook_lock:
        if _hook_handle is not None:
            _hook_handle.remove()
            _hook_handle = None


def is_tracking_optimizer_steps() -> bool:
    """True while the global optimizer post-hook is installed."""
    return _hook_handle is not None


def listeners() -> List[StepListener]:
    """The step listeners now registered (for diagnostics and tests)."""
    with StepTracker._lock:
        return list(StepTracker._listeners.values())
