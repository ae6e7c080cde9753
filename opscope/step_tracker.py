"""A process-wide training step count, fed by every ``optimizer.step()``.

Several things can say "a step happened": the profiler's ``step()``, and
each optimizer. Counting every call would double count (two optimizers, or
an optimizer plus ``prof.step()``, in one iteration), so, like torch's
``KinetoStepTracker``, each *requester* keeps its own count and the global
step is the largest of them. Every optimizer is its own requester
(``Optimizer#1``, ``Optimizer#2``, ...), so a model with two optimizers
still counts one step per iteration.

``track_optimizer_steps()`` installs one global optimizer post-hook (once
per process) that feeds the tracker. It is the only entry opscope keeps in
torch's hook table: listeners added with ``StepTracker.add_listener`` (called
with the new global step each time it grows; on-demand profiling counts its
steps that way) and with ``add_optimizer_listener`` (called with each stepped
optimizer; profile_memory's sightings) live here instead. A listener may start
or stop a profiler, adding or removing listeners, while torch iterates its
table: ours are called from a snapshot, so nothing torch iterates changes.

Example::

    >>> StepTracker.init_step_count("demo")
    >>> before = StepTracker.current_step()
    >>> StepTracker.increment_step("demo") == before + 1
    True
    >>> StepTracker.erase_step_count("demo")
    True
"""

from __future__ import annotations

import gc
import itertools
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional


from opscope.model.torch_names import PROFILER_STEP

PROFILER_REQUESTER = PROFILER_STEP

StepListener = Callable[[int], None]
OptimizerListener = Callable[[Any, Any, Any], None]


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


_optimizer_listeners: Dict[int, OptimizerListener] = {}


def add_optimizer_listener(listener: OptimizerListener) -> int:
    """Call ``listener(optimizer, args, kwargs)`` after each ``optimizer.step()``.

    Returns an id for ``remove_optimizer_listener``. Listeners run before the
    step is counted, so one removed by a step listener of the same step still
    saw that step. Adding or removing one from inside a listener is safe.

    >>> import torch
    >>> seen = []
    >>> key = add_optimizer_listener(lambda opt, args, kwargs: seen.append(type(opt).__name__))
    >>> torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()
    >>> remove_optimizer_listener(key), seen
    (True, ['SGD'])
    """
    if not callable(listener):
        raise TypeError(f"add_optimizer_listener: listener must be callable, got {listener!r}")
    track_optimizer_steps()
    with StepTracker._lock:
        key = next(StepTracker._listener_ids)
        _optimizer_listeners[key] = listener
    return key


def remove_optimizer_listener(key: int) -> bool:
    """Remove an optimizer listener by its id; False when it was not registered."""
    with StepTracker._lock:
        return _optimizer_listeners.pop(key, None) is not None


def optimizer_listeners() -> List[OptimizerListener]:
    """The optimizer listeners now registered (for diagnostics and tests)."""
    with StepTracker._lock:
        return list(_optimizer_listeners.values())


def _requester_of(optimizer: Any) -> str:
    name = _requesters.get(optimizer)
    if name is not None:
        return name
    if _an_optimizer_counted_this_step():
        # A dropped optimizer may still wait in a reference cycle (optimizers
        # hold some); were it taken for a live one, the new optimizer would
        # start one step behind, depending on when the GC last ran. Collect
        # now (once per new optimizer) so only live optimizers count.
        gc.collect()
    name = f"Optimizer#{next(_optimizer_numbers)}"
    _requesters[optimizer] = name
    with StepTracker._lock:
        # Seen at its first step. If another optimizer already counted this
        # iteration, the new one joins it (one behind), so a model with two
        # optimizers does not count its first iteration twice.
        current = StepTracker._current_step
        joins = current > 0 and _counted_by_an_optimizer(current)
        StepTracker._step_dict[name] = current - 1 if joins else current
    weakref.finalize(optimizer, StepTracker.erase_step_count, name)
    return name


def _an_optimizer_counted_this_step() -> bool:
    with StepTracker._lock:
        return _counted_by_an_optimizer(StepTracker._current_step)


def _counted_by_an_optimizer(step: int) -> bool:
    return any(k.startswith("Optimizer#") and v == step for k, v in StepTracker._step_dict.items())


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    # torch.compile tracing an optimizer step must not bake the count into a graph
    from torch.compiler import is_compiling  # here: importing opscope imports no torch

    if is_compiling():
        return
    snapshot = []
    if _optimizer_listeners:  # most steps have none: no lock then
        with StepTracker._lock:
            snapshot = list(_optimizer_listeners.items())
    for key, listener in snapshot:
        if key in _optimizer_listeners:  # not removed by an earlier one meanwhile
            try:
                listener(optimizer, args, kwargs)
            except Exception as exc:  # noqa: BLE001  (inside optimizer.step(): training goes on)
                warnings.warn(f"opscope optimizer listener {listener!r} failed: "
                              f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
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
    """Remove the global optimizer post-hook, if installed.

    Not from inside an optimizer hook: that edits the table torch iterates.
    """
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
