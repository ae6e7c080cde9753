"""The collecting half of the execution trace: our C++ observer (et_observer.cpp).

It is built on first use and cached like the main observer (see
``opscope.collect.native.build``). Only this module talks to it.

Example::

    >>> import torch
    >>> collector = NodeCollector.load()      # RuntimeError if it cannot be built
    >>> collector.register()
    >>> collector.enable(); _ = torch.ones(2) + 1; collector.disable()
    >>> [node[1] for node in collector.take_nodes()][-1]
    'aten::add'
    >>> collector.unregister()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Tuple

from opscope.collect.native.build import NativeExtension

SOURCE = Path(__file__).resolve().with_name("et_observer.cpp")

EXTENSION = NativeExtension(SOURCE, "opscope_et_observer", "execution trace observer",
                            "ExecutionTraceObserver cannot record")

# One node as take_nodes() returns it; see et_observer.cpp and writer.py.
RawNode = Tuple[Any, ...]


class NodeCollector:
    """The process-wide RecordFunction callback that records execution-trace nodes."""

    def __init__(self, ext: Any):
        self._ext = ext

    @classmethod
    def load(cls) -> "NodeCollector":
        """Build (first use) and load the observer; RuntimeError when that fails."""
        ext = EXTENSION.load()
        if ext is None:
            raise RuntimeError(
                "opscope.ExecutionTraceObserver needs its native observer (et_observer.cpp), "
                f"which could not be built: {EXTENSION.failure_reason()}")
        return cls(ext)

    def register(self) -> None:
        """Add the callback, disabled; RuntimeError if one is registered already."""
        if not self._ext.register_observer():
            raise RuntimeError(
                "another opscope.ExecutionTraceObserver is already registered in this "
                "process; call its unregister_callback() first (one per process)")

    def enable(self) -> None:
        """Record ops from now on (the callback must be registered)."""
        self._ext.enable()

    def disable(self) -> None:
        """Stop recording ops; what was recorded waits for ``take_nodes``."""
        self._ext.disable()

    def take_nodes(self) -> List[RawNode]:
        """The nodes finished since the last call, in the order they finished."""
        return self._ext.take_nodes()

    def unregister(self) -> None:
        """Remove the callback; tensor and node ids start over at the next register."""
        self._ext.unregister_observer()

    def is_registered(self) -> bool:
        """True while the callback is registered with RecordFunction."""
        return bool(self._ext.is_registered())
