"""The native collector: our C++ RecordFunction observer (observer.cpp).

Example::

    >>> c = NativeCollector.load()   # None when the observer could not be built
    >>> c is None or c.name == "native"
    True
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
import warnings
from typing import Any, Optional

import numpy as np

from opscope.arguments import check_name
from opscope.collect.native.build import load_native
from opscope.collect.stack_frames import stack_table
from opscope.collect.thread_names import ThreadNames
from opscope.model.records import MEMORY_DTYPE, NO_STACK, RECORD_DTYPE, RawSession


# Set once the "stacks are off" warning was shown: it is shown once per process.
_stack_warning_shown = False
# Set (to anything): the observer reads no Python frames, as on an unknown layout.
NO_FRAME_WALK_ENV = "OPSCOPE_NO_FRAME_WALK"


def stacks_off_message() -> str:
    """The one line shown when ``with_stack`` cannot read this Python's frames.

    >>> "stacks are off" in stacks_off_message()
    True
    """
    if os.environ.get(NO_FRAME_WALK_ENV) is not None:
        why = f"{NO_FRAME_WALK_ENV} is set"
    else:
        build = sys.version.split()[0]
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            build += " (free-threaded)"
        why = f"the native observer does not know Python {build}'s frame layout"
    return (f"opscope: with_stack=True: {why}, so stacks are off (ops are still recorded; "
            f"OPSCOPE_COLLECTOR=python records stacks, more slowly)")


def warn_stacks_off_once(ext: Any) -> None:
    """Warns once per process when the observer cannot walk Python frames."""
    global _stack_warning_shown
    if _stack_warning_shown or ext.frame_walk_supported():
        return
    _stack_warning_shown = True
    warnings.warn(stacks_off_message(), RuntimeWarning, stacklevel=2)


class NativeCollector:
    """Records every RecordFunction event on every thread, in C++."""

    name = "native"

    def __init__(self, ext: Any):
        self._ext = ext
        self._start_ns = 0
        self._epoch_offset_ns = 0
        self._dropped_at_start = 0
        self._thread_names = ThreadNames()

    @classmethod
    def load(cls) -> Optional["NativeCollector"]:
        ext = load_native()
        return cls(ext) if ext is not None else None

    def now_ns(self) -> int:
        return int(self._ext.now_ns())

    def start(self, *, record_shapes: bool = False, profile_memory: bool = False,
              with_stack: bool = False) -> None:
        if with_stack:
            warn_stacks_off_once(self._ext)
        self._epoch_offset_ns = time.time_ns() - self.now_ns()
        self._thread_names.start()
        self._dropped_at_start = int(self._ext.dropped_records())
        self._ext.start(bool(record_shapes), bool(profile_memory), bool(with_stack))
        self._start_ns = self.now_ns()

    def stop(self) -> RawSession:
        blob, inputs, tids, names, stop_ns, memory, stacks = self._ext.stop()
        dropped = int(self._ext.dropped_records()) - self._dropped_at_start
        if dropped > 0:
            warnings.warn(f"opscope: {dropped} ops, inputs, stacks or allocations were left "
                          f"out while recording (memory ran out, or torch could not describe an "
                          f"input); what was recorded is kept", RuntimeWarning, stacklevel=2)
        records = np.frombuffer(blob, dtype=RECORD_DTYPE)  # a bytearray: writable, not copied
        unfinished = records["end_ns"] == 0  # open at stop: they end there, not before they start
        records["end_ns"][unfinished] = np.maximum(records["start_ns"][unfinished], stop_ns)
        stack_ids = table = None
        if stacks is not None:
            ids, begin, entries, frames = stacks
            stack_ids = np.frombuffer(ids, dtype=np.uint32).astype(np.int64)
            stack_ids[stack_ids == 0xFFFFFFFF] = NO_STACK
            table = stack_table(np.frombuffer(begin, dtype=np.uint32),
                                np.frombuffer(entries, dtype=np.uint32), frames)
        return RawSession(
            memory=np.frombuffer(memory, dtype=MEMORY_DTYPE),  # read-only: not copied
            stack_ids=stack_ids,
            stack_table=table,
            records=records,
            inputs=[np.frombuffer(b, dtype=np.int64) for b in inputs],
            thread_ids=list(tids),
            names=list(names),
            start_ns=self._start_ns,
            stop_ns=int(stop_ns),
            epoch_offset_ns=self._epoch_offset_ns,
            collector=self.name,
            process_id=os.getpid(),
            thread_names=self._thread_names.names(),
        )

    def is_recording(self) -> bool:
        return bool(self._ext.is_recording())

    def forget_after_fork(self) -> None:
        """In a forked child: nothing to do here; observer.cpp's own at-fork
        handler already stopped recording and freed the parent's buffers."""

    def held_record_bytes(self) -> int:
        """Bytes of record chunks the observer still holds (call while not recording)."""
        return int(self._ext.held_record_bytes())

    def taken_bytes(self) -> int:
        """Bytes of record and input regions taken since the module loaded (while
        recording too): what a window holds is its growth since the window started."""
        return int(self._ext.regions_taken()) * int(self._ext.region_bytes)

    def install_fatal(self, prefix: str) -> None:
        """A crash (SIGSEGV, SIGBUS, SIGFPE, SIGABRT) writes the black box's windows raw to
        ``prefix`` + Unix ms + ``.raw`` (observer.cpp), then goes on as before."""
        now = self.now_ns()
        self._ext.install_fatal(prefix, time.time_ns() - now, now)

    def set_fatal_windows(self, windows, live_start_ns: int) -> None:
        """What a crash writes besides the live window: ``(records, OS thread ids as
        int64, start_ns, stop_ns)`` per finished window, oldest first."""
        self._ext.set_fatal_windows(list(windows), int(live_start_ns))

    def uninstall_fatal(self) -> None:
        self._ext.uninstall_fatal()

    # User ranges as real at::RecordFunction scopes, seen by every observer.
    def range_push(self, name: str, user_scope: bool = True) -> int:
        # A NUL or a lone surrogate could not be recorded exactly: refused
        # before anything is pushed (observer.cpp refuses a NUL too).
        return int(self._ext.range_push(check_name("record_function", "name", name),
                                        bool(user_scope)))

    def range_pop(self, handle: int) -> None:
        self._ext.range_pop(handle)
