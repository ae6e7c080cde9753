"""An empty at::RecordFunction observer: the floor under any RecordFunction-based profiler.

While it is registered, every op pays for RecordFunction's own machinery (building the
RecordFunction, looking up callbacks, calling them, and with ``needs_inputs`` collecting
the inputs) but the observer records nothing. It lives in opscope's native module
(``empty_observer_start``/``empty_observer_stop`` in ``opscope/collect/native/observer/ranges.h``).

Example::

    with empty_observer(needs_inputs=False):
        workload()
"""

from __future__ import annotations

import contextlib


def load():
    """opscope's native module (built on first use), which carries the empty observer."""
    from opscope.collect.native.build import failure_reason, load_native

    module = load_native()
    if module is None:
        raise RuntimeError(f"the native collector is unavailable: {failure_reason()}")
    return module


@contextlib.contextmanager
def empty_observer(needs_inputs: bool = False):
    """Register the empty observer for the ``with`` block."""
    mod = load()
    mod.empty_observer_start(needs_inputs)
    try:
        yield
    finally:
        mod.empty_observer_stop()
