"""Python threads' names by OS thread id, so traces and reports show ``MainThread``.

The collectors record OS thread ids; Python knows the names of its own threads
(``threading.Thread.name``). A snapshot is taken when recording starts and when
it stops, and every thread started in between is noted as it starts (through
``threading.Thread.start``, wrapped while anything records), so a thread that
ran ops and ended before stop keeps its name.

>>> import threading
>>> live_thread_names()[threading.get_native_id()] == threading.current_thread().name
True
>>> names = ThreadNames()
>>> names.start()
>>> t = threading.Thread(target=lambda: None, name="loader-1")
>>> t.start(); t.join()
>>> names.names()[t.native_id]
'loader-1'
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

_watchers: "weakref.WeakSet[ThreadNames]" = weakref.WeakSet()  # recording now
_original_start: Optional[Callable[..., Any]] = None


def live_thread_names() -> Dict[int, str]:
    """OS thread id -> name of every running Python thread."""
    names: Dict[int, str] = {}
    for thread in threading.enumerate():
        native_id = getattr(thread, "native_id", None)
        if isinstance(native_id, int) and isinstance(thread.name, str):
            names[native_id] = thread.name
    return names


def _start_and_note(thread: threading.Thread, *args: Any, **kwargs: Any) -> Any:
    """``Thread.start`` while recording: start it, then tell each watcher its id and name
    (``start`` returns once the thread runs, so its ``native_id`` is set)."""
    out = _original_start(thread, *args, **kwargs)  # type: ignore[misc]
    for watcher in list(_watchers):
        watcher._note(thread)
    return out


def _watch(names: "ThreadNames") -> None:
    global _original_start
    _watchers.add(names)
    if threading.Thread.__dict__.get("start") is not _start_and_note:
        _original_start = threading.Thread.__dict__["start"]
        threading.Thread.start = _start_and_note  # type: ignore[method-assign]


def _unwatch(names: "ThreadNames") -> None:
    _watchers.discard(names)
    if not _watchers and threading.Thread.__dict__.get("start") is _start_and_note:
        threading.Thread.start = _original_start  # type: ignore[method-assign]


class ThreadNames:
    """Names seen at ``start()``, of threads started since, and at ``names()``, the later
    winning for a reused id. ``names()`` ends the watch."""

    def __init__(self) -> None:
        self._seen: Dict[int, str] = {}
        # threads started while watching: (the thread, its id, its name when started)
        self._started: List[Tuple[Callable[[], Any], int, str]] = []

    def start(self) -> None:
        self._seen = live_thread_names()
        self._started = []
        _watch(self)

    def _note(self, thread: threading.Thread) -> None:
        native_id = getattr(thread, "native_id", None)
        if isinstance(native_id, int):
            self._started.append((weakref.ref(thread), native_id, str(thread.name)))

    def names(self) -> Dict[int, str]:
        _unwatch(self)
        out = dict(self._seen)
        for ref, native_id, name in list(self._started):
            thread = ref()  # renamed while it ran: its last name
            out[native_id] = str(thread.name) if thread is not None else name
        out.update(live_thread_names())
        return out

    def __del__(self) -> None:  # a recording that failed to start never calls names()
        try:
            _unwatch(self)
        except Exception:
            pass
