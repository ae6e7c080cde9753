"""Python threads' names by OS thread id, so traces and reports show ``MainThread``.

The collectors record OS thread ids; Python knows the names of its own threads
(``threading.Thread.name``). A snapshot is taken when recording starts and when
it stops, so a thread that ends in between keeps its name.

>>> import threading
>>> live_thread_names()[threading.get_native_id()] == threading.current_thread().name
True
"""

from __future__ import annotations

import threading
from typing import Dict


def live_thread_names() -> Dict[int, str]:
    """OS thread id -> name of every running Python thread."""
    names: Dict[int, str] = {}
    for thread in threading.enumerate():
        native_id = getattr(thread, "native_id", None)
        if isinstance(native_id, int) and isinstance(thread.name, str):
            names[native_id] = thread.name
    return names


class ThreadNames:
    """Names seen at ``start()`` and at ``names()``, the later winning for a reused id."""

    def __init__(self) -> None:
        self._seen: Dict[int, str] = {}

    def start(self) -> None:
        self._seen = live_thread_names()

    def names(self) -> Dict[int, str]:
        out = dict(self._seen)
        out.update(live_thread_names())
        return out
