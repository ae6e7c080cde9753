"""Advance the profiler once per ``optimizer.step()``, after the step returns.

torch's optimizer post-hooks run inside the ``Optimizer.step#...`` range, so a
``prof.step()`` there would close ``ProfilerStep#N`` while that range is still
open, and the two would cross. Instead we wrap the step function that torch
itself wraps (``Optimizer.profile_hook_step``), so the callback runs after the
``Optimizer.step#...`` range has closed and each ``ProfilerStep#N`` contains it.
Everything is restored on exit.

Example::

    >>> import torch
    >>> steps = []
    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    >>> with after_optimizer_steps(lambda: steps.append(1)):
    ...     opt.step(); opt.step()
    >>> len(steps), getattr(type(opt).step, "_opscope_inner", None) is None
    (2, True)
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, List

from torch.optim import Optimizer

_INNER = "_opscope_inner"


def _all_subclasses(cls: type) -> List[type]:
    found, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


@contextlib.contextmanager
def after_optimizer_steps(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback()`` after every outermost ``optimizer.step()`` returns."""
    depth = [0]

    def outer(inner: Callable) -> Callable:
        @functools.wraps(inner)
        def step(*args, **kwargs):
            depth[0] += 1
            try:
                return inner(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    callback()

        setattr(step, _INNER, inner)
        step.hooked = True  # type: ignore[attr-defined]  (torch must not wrap it again)
        return step

    original_hook = Optimizer.__dict__["profile_hook_step"]
    torch_hook = original_hook.__func__

    def profile_hook_step(func):
        return outer(torch_hook(func))

    Optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[assignment]
    for cls in _all_subclasses(Optimizer):  # classes torch hooked before we started
        step = cls.__dict__.get("step")
        if step is not None and getattr(step, "hooked", False) and not hasattr(step, _INNER):
            cls.step = outer(step)
    try:
        yield
    finally:
        Optimizer.profile_hook_step = original_hook
        for cls in _all_subclasses(Optimizer):
            step = cls.__dict__.get("step")
            if step is not None and hasattr(step, _INNER):
                inner = getattr(step, _INNER)
                inner.hooked = True  # torch marked our wrapper; keep its own marked
                cls.step = inner
