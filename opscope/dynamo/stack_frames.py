"""Telling the user's Python frames from torch's and opscope's own.

Recorded stacks hold frames as ``"path/file.py(12): function"``, innermost
first. A graph-break finder wants the user's lines: frames in torch, in
opscope and built-ins are left out.

Example::

    >>> user_frames(["<built-in method item of Tensor object>",
    ...              "/home/me/train.py(9): forward", "/home/me/train.py(30): <module>"])
    ['/home/me/train.py(9): forward', '/home/me/train.py(30): <module>']
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch

from opscope.collect.stack_frames import FrameFormatter

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# this file is opscope/dynamo/stack_frames.py: the package folder is two levels up
_OPSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Recorded frames show paths relative to their sys.path folder ("torch/nn/..."),
# so each directory is also known by that short form.
_SHORT = FrameFormatter()
_TORCH_PREFIXES = (_TORCH_DIR, _SHORT.short_path(_TORCH_DIR))
_OPSCOPE_PREFIXES = (_OPSCOPE_DIR, _SHORT.short_path(_OPSCOPE_DIR))

# Frames that mean the op was issued by a profiler itself (its setup or
# teardown), not by the program being profiled.
_PROFILER_FILES = tuple(
    os.path.join(prefix, *parts)
    for prefixes, files in ((_TORCH_PREFIXES, (("autograd", "profiler.py"),
                                               ("profiler", "profiler.py"))),
                            (_OPSCOPE_PREFIXES, (("api", "profiler.py"), ("record_function.py",))))
    for prefix in prefixes for parts in files)


def is_internal_frame(frame: str) -> bool:
    """True for a built-in, torch or opscope frame.

    >>> is_internal_frame(_TORCH_DIR + "nn/modules/linear.py(125): forward")
    True
    >>> is_internal_frame(_SHORT.short_path(_TORCH_DIR) + "nn/modules/linear.py(125): forward")
    True
    """
    return ("<built-in" in frame or frame.startswith(_TORCH_PREFIXES)
            or "site-packages/torch/" in frame or frame.startswith(_OPSCOPE_PREFIXES))


def user_frames(stack: Optional[Sequence[str]]) -> List[str]:
    """The user's frames of ``stack``, in the same (innermost-first) order."""
    return [frame for frame in (stack or ()) if not is_internal_frame(frame)]


def issued_by_profiler(stack: Optional[Sequence[str]]) -> bool:
    """True when a profiler's own code is on ``stack`` (such ops are not graph breaks).

    >>> issued_by_profiler([_OPSCOPE_DIR + "api/profiler.py(180): start", "x.py(3): <module>"])
    True
    """
    return any(frame.startswith(_PROFILER_FILES) for frame in (stack or ()))
