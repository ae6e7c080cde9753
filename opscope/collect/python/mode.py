"""The Python collector's dispatch mode: it times every aten op a recorded thread runs.

``OpMode`` hands each op to its recording (``recording.Recording``): the
name id, the encoded inputs, the stack, and one row in the thread's buffer.
Once the recording stops, the mode is inert and takes itself off the thread's
mode stack after the current op.

>>> import torch
>>> remove_mode(object())  # not on this thread's stack
False
"""

from __future__ import annotations

import functools
import os
import sys

from torch.utils._python_dispatch import (
    TorchDispatchMode, _get_current_dispatch_mode_stack, _len_torch_dispatch_stack, _pop_mode,
    _push_mode,
)

from opscope.collect.python.rows import monotonic_ns
from opscope.model.records import NO_INPUTS, SCOPE_FUNCTION

SKIP = -1  # name id of ops we never record (record_function's own profiler:: ops)


class OpMode(TorchDispatchMode):
    """Times each aten op handed to it; inert once its recording has stopped."""

    # Else a higher-order op (torch.cond, flex_attention...) raises under the mode;
    # torch < 2.9 ignores the flag, and collect.python.hops registers a rule instead.
    supports_higher_order_operators = True

    def __init__(self, recording):  # a recording.Recording
        super().__init__()
        self._rec = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = self._rec
        if kwargs is None:
            kwargs = {}
        if not rec.active:
            if rec.pushed:
                rec.schedule_removal()
            return func(*args, **kwargs)
        name_id = rec.op_ids.get(func)
        if name_id is None:
            name_id = rec.op_name_id(func)
        if name_id == SKIP:
            return func(*args, **kwargs)
        buf = rec.buffer()
        offset = rec.encode(buf, func, args, kwargs) if rec.record_shapes else NO_INPUTS
        stack = rec.stack_id(sys._getframe(1)) if rec.with_stack else -1
        start = monotonic_ns()
        try:
            return func(*args, **kwargs)
        finally:
            if stack >= 0:
                buf.stacks[len(buf.rows)] = stack
            buf.rows.append((start, monotonic_ns(), -1, name_id, buf.index, 0, buf.index + 1,
                             offset, SCOPE_FUNCTION, 0, 0))


@functools.lru_cache(maxsize=None)
def is_dispatch_wrapper(code) -> bool:
    """Frames between an op call and ``__torch_dispatch__``: torch's dynamo-disable
    wrapper around dispatch modes. They are not where the op was called."""
    name = code.co_filename.replace(os.sep, "/")
    return name.endswith(("torch/_dynamo/eval_frame.py", "torch/_compile.py"))


def remove_mode(mode: TorchDispatchMode) -> bool:
    """Take ``mode`` off this thread's stack, keeping the modes above it in order."""
    if not any(m is mode for m in _get_current_dispatch_mode_stack()):
        return False
    above = []
    while _len_torch_dispatch_stack() > 0:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)
    return True
