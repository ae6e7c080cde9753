"""Collectors: the only layer that touches live torch hooks.

``choose_collector()`` returns the native observer when it builds, else the
Python fallback. ``OPSCOPE_COLLECTOR=native|python`` forces one.

Every collector follows the ``Collector`` protocol (``collect/collector.py``):
``name``, ``start(record_shapes=...)``, ``stop() -> RawSession``, ``now_ns()`` (its
clock), ``range_push(name) -> handle``, ``range_pop(handle)`` and
``forget_after_fork()``. ``collect/recording.py`` puts a collector and the optional
hooks together for one recording window.
"""

from __future__ import annotations

import os

from opscope.collect.collector import Collector

COLLECTOR_ENV = "OPSCOPE_COLLECTOR"


def requested_collector() -> str:
    """``"native"``, ``"python"`` or ``""`` (no preference), from ``$OPSCOPE_COLLECTOR``.

    >>> import os; os.environ.pop(COLLECTOR_ENV, None) and None; requested_collector()
    ''
    """
    wanted = os.environ.get(COLLECTOR_ENV, "").strip().lower()
    if wanted not in ("", "native", "python"):
        raise ValueError(f"{COLLECTOR_ENV} must be 'native' or 'python', got {wanted!r}")
    return wanted


def choose_collector() -> Collector:
    """The collector to use now, honouring ``$OPSCOPE_COLLECTOR``."""
    wanted = requested_collector()
    if wanted != "python":
        from opscope.collect.native.collector import NativeCollector

        native = NativeCollector.load()
        if native is not None:
            return native
        if wanted == "native":
            from opscope.collect.native.build import failure_reason

            raise RuntimeError(f"{COLLECTOR_ENV}=native but the native collector is unavailable: "
                               f"{failure_reason()}")
    from opscope.collect.python.collector import PythonCollector

    return PythonCollector()


def native_available() -> bool:
    """True when the native observer is (or can be) built and loaded."""
    from opscope.collect.native.build import load_native

    return load_native() is not None


__all__ = ["COLLECTOR_ENV", "Collector", "choose_collector", "native_available",
           "requested_collector"]
