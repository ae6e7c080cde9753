"""Which Python frames are torch's plumbing, folded away by default in the report's stacks.

A stack recorded with ``with_stack`` is mostly torch's own call machinery: each
``module(x)`` adds ``torch/nn/modules/module.py`` ``_wrapped_call_impl`` and
``_call_impl``, a ``no_grad`` decorator adds ``decorate_context``, ``loss.backward()``
adds three frames of ``torch/autograd``, and ``opscope run`` starts the script
through ``runpy`` and its own runner. They say nothing about the user's code, and
they push the user's own line out of a capped stack. ``PLUMBING`` lists them as
(file inside the torch package, function), ``LAUNCHERS`` as files whose every
frame is plumbing; a frame is ``path(line): function``.

Example::

    >>> is_plumbing("/usr/lib/python3/site-packages/torch/nn/modules/module.py(1751): _call_impl")
    True
    >>> is_plumbing("torch/nn/modules/linear.py(125): forward"), is_plumbing("train.py(9): step")
    (False, False)
    >>> is_plumbing("<frozen runpy>(88): _run_code"), is_plumbing("opscope/script.py(82): run_script")
    (True, True)
    >>> fold_frames(["m.py(3): forward", "torch/nn/modules/module.py(1762): _call_impl", "t.py(9): main"])
    ['m.py(3): forward', 't.py(9): main']
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import List, Sequence

PLUMBING = (
    ("torch/nn/modules/module.py", ("_call_impl", "_wrapped_call_impl", "inner")),
    ("torch/utils/_contextlib.py", ("decorate_context",)),
    ("torch/optim/optimizer.py", ("wrapper", "_use_grad", "maybe_fallback")),
    ("torch/_tensor.py", ("backward",)),
    ("torch/autograd/__init__.py", ("backward",)),
    ("torch/autograd/graph.py", ("_engine_run_backward",)),
    ("torch/_dynamo/eval_frame.py", ("_fn", "__call__")),
    ("torch/_compile.py", ("inner",)),
)
# (recording leaves these out since issue 27; older traces still hold them)
LAUNCHERS = ("<frozen runpy>", "runpy.py", "opscope/__main__.py", "opscope/cli/main.py",
             "opscope/cli/run.py", "opscope/script.py", "opscope/cli/torchrun.py",
             "opscope/cli/step_hook.py", "bin/opscope")
_FRAME = re.compile(r"(?P<path>.*)\(\d+\): (?P<function>.*)\Z", re.DOTALL)


@lru_cache(maxsize=65536)
def is_plumbing(frame: str) -> bool:
    """True for a frame of torch's call machinery (``PLUMBING``)."""
    m = _FRAME.match(frame)
    if m is None:
        return False
    path = m.group("path").replace("\\", "/")
    function = m.group("function")
    def is_file(suffix: str) -> bool:
        return path == suffix or path.endswith("/" + suffix)

    return any(is_file(f) for f in LAUNCHERS) or any(
        is_file(suffix) and function in functions for suffix, functions in PLUMBING)


def fold_frames(frames: Sequence[str]) -> List[str]:
    """``frames`` without torch's plumbing frames, order kept."""
    return [f for f in frames if not is_plumbing(f)]
