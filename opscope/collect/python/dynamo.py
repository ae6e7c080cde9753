"""Undo what recording with a dispatch mode taught dynamo: "skip this code forever".

While any non-infra ``TorchDispatchMode`` is on the stack, dynamo does not
compile a frame it meets; on torch 2.13 it also marks that code object as
skipped for good. So a ``torch.compile``'d function first called while the
Python collector recorded stays eager after ``stop()``, and ``torch.cond``
(compiled internally on each call) raises ``Unsupported`` on every later call.

``DynamoCodesMet`` notes each code dynamo's frame callback meets while our
mode is on the stack (through dynamo's own registry of them, ``input_codes``)
and, at stop, sets those codes back to dynamo's default strategy, keeping what
they compiled; a code skipped for another reason is just skipped again after one
more look. It acts only where dynamo checks the mode stack itself: older dynamo
(2.4 to 2.8) checks a flag that a pushed mode does not set, compiles such frames,
and has nothing to undo. Where dynamo lacks these internals, nothing is done.

Example::

    >>> met = DynamoCodesMet()
    >>> met.install(object()); met.uninstall()
    0
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Optional

from torch.utils._python_dispatch import _get_current_dispatch_mode_stack


def _tracker() -> Optional[Any]:
    """dynamo's registry of the codes it met, where dynamo skips frames for a mode
    on the stack (it imports ``any_torch_dispatch_mode_on_stack`` for that)."""
    module = sys.modules.get("torch._dynamo.convert_frame")
    if not hasattr(module, "any_torch_dispatch_mode_on_stack"):
        return None
    tracker = getattr(module, "input_codes", None)
    return tracker if callable(getattr(tracker, "add", None)) else None


def _make_default():
    """A function that gives a code dynamo's default strategy back, or None."""
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:
        return None
    default = FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)
    return lambda code: set_code_exec_strategy(code, default)


class DynamoCodesMet:
    """Codes dynamo met between ``install`` and ``uninstall``; released at uninstall."""

    def __init__(self) -> None:
        self._codes: Dict[int, Any] = {}  # id -> code: kept alive until released
        self._lock = threading.Lock()
        self._tracker: Optional[Any] = None

    def install(self, mode: Any) -> None:
        """Start noting the codes dynamo meets while ``mode`` is on the thread's stack."""
        tracker = _tracker()
        if tracker is None or "add" in vars(tracker):
            return  # no such dynamo, or someone else wraps it: leave it alone
        original = tracker.add

        def add(code, *args, **kwargs):
            if any(m is mode for m in _get_current_dispatch_mode_stack()):
                with self._lock:
                    self._codes[id(code)] = code
            return original(code, *args, **kwargs)

        tracker.add = add  # an instance attribute shadowing the method
        self._tracker = tracker

    def uninstall(self) -> int:
        """Stop noting codes; give each one noted the default strategy. How many."""
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            vars(tracker).pop("add", None)
        with self._lock:
            codes, self._codes = list(self._codes.values()), {}
        make_default = _make_default() if codes else None
        if make_default is None:
            return 0
        done = 0
        for code in codes:
            try:
                make_default(code)
            except Exception:  # a code dynamo no longer knows: nothing to undo
                continue
            done += 1
        return done
