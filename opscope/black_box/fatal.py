"""The black box at a crash: the ring written raw from the signal handler.

On SIGSEGV, SIGBUS, SIGFPE or SIGABRT nothing in Python can run, so the
native observer (``collect/native/observer/fatal.h``: ``install_fatal``) writes the ring
itself, with async-signal-safe calls only, to
``DIR/<script>.blackbox.fatal.<unix_ms>.raw``, and the process then dies as
it would have. :class:`FatalDump` installs that handler and keeps it told
of the ring's finished windows (their record arrays stay alive while it
points at them); ``opscope.load.raw_black_box`` reads the file back, so
``opscope table``, ``report`` and ``convert`` take it like a trace.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, List

import numpy as np

from opscope.model.records import RawSession


class FatalDump:
    """The crash handler of one black box's collector."""

    def __init__(self, collector: Any):
        self._collector = collector
        self.installed = False

    def install(self, folder: str, script: str) -> None:
        """Write at a crash into ``folder`` (made now: no folder can be made then)."""
        try:
            folder = os.path.abspath(folder)
            os.makedirs(folder, exist_ok=True)
            self._collector.install_fatal(os.path.join(folder, f"{script}.blackbox.fatal."))
            self.installed = True
        except Exception as exc:  # noqa: BLE001 - never harm the job: one line
            warnings.warn(f"opscope: the black box writes nothing at a crash: {exc}",
                          RuntimeWarning, stacklevel=3)

    def register(self, windows: List[RawSession], live_start_ns: int) -> None:
        """The ring's finished windows as they are now, and the live window's start."""
        if self.installed:
            self._collector.set_fatal_windows(
                [(raw.records, np.asarray(raw.thread_ids, np.int64), raw.start_ns, raw.stop_ns)
                 for raw in windows if raw.collector == "native"], live_start_ns)

    def uninstall(self) -> None:
        if self.installed:
            self.installed = False
            self._collector.uninstall_fatal()
