"""Run a function once torch is imported: at once if it is, else right after its import.

``import opscope`` does not import torch (the CLI's ``--help``, ``trigger`` and the
store verbs need none of it), yet two things must be in place as soon as the
program has torch: the optimizer-step hook (``step_tracker``) and on-demand
profiling from the environment. ``after_torch_import(fn)`` runs ``fn`` then.

Example::

    >>> import torch
    >>> seen = []
    >>> after_torch_import(lambda: seen.append("now"))
    >>> seen
    ['now']
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Callable, List

_lock = threading.Lock()
_pending: List[Callable[[], None]] = []


def after_torch_import(fn: Callable[[], None]) -> None:
    """Call ``fn`` now when torch is imported, else once ``import torch`` has finished."""
    with _lock:
        if "torch" not in sys.modules:
            _pending.append(fn)
            if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _AfterTorchImport())
            return
    fn()


def _run_pending() -> None:
    with _lock:
        todo, _pending[:] = list(_pending), []
    for fn in todo:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  (never break the program's import of torch)
            warnings.warn(f"opscope: after importing torch: {type(exc).__name__}: {exc}",
                          RuntimeWarning)


class _AfterTorchImport:
    """A meta path finder that answers no import: it wraps torch's loader for one run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if callable(exec_module):
            try:
                loader.exec_module = _then_run_pending(exec_module)
            except (AttributeError, TypeError):  # a loader with __slots__: run at first use
                pass
        return spec


def _then_run_pending(exec_module: Callable[[Any], None]) -> Callable[[Any], None]:
    done = []

    def exec_then_run(module: Any) -> None:
        exec_module(module)  # torch's own import: its errors are the program's
        if not done and getattr(module, "__name__", None) == "torch":
            done.append(True)
            _run_pending()

    return exec_then_run
