"""Python frames as torch.profiler prints them: ``file.py(12): function``.

A file under one of ``sys.path``'s folders (site-packages, the script's
folder) is shown relative to the longest such folder, as torch shows
``torch/nn/modules/linear.py`` for a file deep in site-packages.

Frames of opscope's own code (its runner, ``opscope/cli/step_hook.py``), of
``runpy`` and of the ``opscope`` console script are left out of recorded stacks
(:func:`is_runner_frame`): under ``opscope run`` they ended every stack.

Example::

    >>> import os, sys
    >>> root = os.path.abspath(sys.path[0] or ".")
    >>> FrameFormatter([root]).format(os.path.join(root, "train.py"), 12, "step")
    'train.py(12): step'
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep


@lru_cache(maxsize=4096)
def is_runner_frame(filename: str, function: str) -> bool:
    """True for a frame of opscope's own code, of ``runpy``, or of the ``opscope`` script.

    >>> is_runner_frame("<frozen runpy>", "_run_code"), is_runner_frame(__file__, "f")
    (True, True)
    >>> is_runner_frame("/home/me/train.py", "<module>")
    False
    """
    if filename in ("<frozen runpy>", _STDLIB + "runpy.py"):
        return True
    if os.path.basename(filename) == "opscope" and function == "<module>":
        return True  # the console script pip writes for opscope
    return os.path.isabs(filename) and os.path.abspath(filename).startswith(_PACKAGE)


class FrameFormatter:
    """Formats frames, shortening paths against a list of root folders."""

    def __init__(self, roots: Optional[Iterable[str]] = None):
        if roots is None:
            roots = [p or os.getcwd() for p in sys.path]
        cleaned = {os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots if r}
        self._roots = sorted(cleaned, key=len, reverse=True)
        self._short: Dict[str, str] = {}

    def short_path(self, filename: str) -> str:
        short = self._short.get(filename)
        if short is None:
            short = filename
            if os.path.isabs(filename):
                for root in self._roots:
                    if filename.startswith(root):
                        short = filename[len(root):]
                        break
            self._short[filename] = short
        return short

    def format(self, filename: str, line: int, function: str) -> str:
        return f"{self.short_path(filename)}({line}): {function}"

    def stack(self, frames: Iterable[Tuple[str, int, str]]) -> List[str]:
        """(filename, line, function) frames as text, without :func:`is_runner_frame`'s."""
        return [self.format(f, line, fn) for f, line, fn in frames
                if not is_runner_frame(f, fn)]


def stack_table(begin: np.ndarray, entries: np.ndarray,
                frames: Sequence[Tuple[str, int, str]]) -> List[List[str]]:
    """Stacks (innermost first) from the native observer's flat arrays.

    ``begin[k]:begin[k+1]`` are stack ``k``'s positions in ``entries``, which
    index ``frames`` (filename, line, function).

    >>> stack_table(np.array([0, 2, 3]), np.array([0, 1, 1]),
    ...             [("/x/a.py", 3, "f"), ("/x/b.py", 9, "g")])[0]
    ['/x/a.py(3): f', '/x/b.py(9): g']
    """
    fmt = FrameFormatter()
    text = [None if is_runner_frame(f, fn) else fmt.format(f, line, fn) for f, line, fn in frames]
    starts = begin.tolist()
    flat = [text[e] for e in entries.tolist()]
    return [[t for t in flat[starts[k]:starts[k + 1]] if t is not None]
            for k in range(len(starts) - 1)]
