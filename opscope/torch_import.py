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
from typing import Any, Callable, Dict, List

_lock = threading.Lock()
_pending: Dict[str, List[Callable[[], None]]] = {}


def after_torch_import(fn: Callable[[], None]) -> None:
    """Call ``fn`` now when torch is imported, else once ``import torch`` has finished."""
    after_import("torch", fn)


def after_import(module: str, fn: Callable[[], None]) -> None:
    """Call ``fn`` now when ``module`` is imported, else once its import has finished
    (``torch._inductor.config``, say, which torch imports only for a first compile)."""
    with _lock:
        if module not in sys.modules:
            _pending.setdefault(module, []).append(fn)
            if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _AfterTorchImport())
            return
    fn()


def _run_pending(module: str = "torch") -> None:
    with _lock:
        todo = _pending.pop(module, [])
        if not _pending:  # nothing else awaited: the finder leaves the import path
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorchImport)]
    for fn in todo:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  (never break the program's import of torch)
            warnings.warn(f"opscope: after importing {module}: {type(exc).__name__}: {exc}",
                          RuntimeWarning)


class _AfterTorchImport:
    """A meta path finder that answers no import: it wraps the loader of a module that
    something waits for, for one run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _pending:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if isinstance(finder, _AfterTorchImport):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if callable(exec_module):
            try:
                loader.exec_module = _then_run_pending(exec_module, name)
            except (AttributeError, TypeError):  # a loader with __slots__: run at first use
                pass
        return spec


def _then_run_pending(exec_module: Callable[[Any], None], name: str = "torch"
                      ) -> Callable[[Any], None]:
    done = []

    def exec_then_run(module: Any) -> None:
        exec_module(module)  # the module's own import: its errors are the program's
        if not done and getattr(module, "__name__", None) == name:
            done.append(True)
            _run_pending(name)

    return exec_then_run
