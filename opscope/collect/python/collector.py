"""The pure-Python collector: the fallback when the native observer can't be built.

How it records:

- **Ops**: a ``TorchDispatchMode`` on each recorded thread's mode stack times
  every aten call it is handed and names it by the op's schema name
  (``aten::addmm``), scope FUNCTION, ``seq_nr`` -1.
- **Ranges**: our own ``range_push``/``range_pop``, and every
  ``torch.autograd.profiler.record_function`` (the same class as
  ``torch.profiler.record_function``; it is how torch labels
  ``Optimizer.step#SGD.step`` and ``ProfilerStep#N``), whose ``__enter__`` and
  ``__exit__`` are wrapped while recording. Both are scope USER.
- **Backward**: ``torch.autograd.backward`` and ``torch.autograd.grad`` are
  wrapped while recording; each call puts a pre- and a post-hook on every node of
  the graph it runs (removed when it returns), which record
  ``autograd::engine::evaluate_function: AddmmBackward0`` (FUNCTION) around
  ``AddmmBackward0`` (BACKWARD_FUNCTION, ``seq_nr`` = the node's).
- **Threads**: the mode stack is thread-local. The thread that calls ``start``
  gets the mode at once. A thread started while recording gets it on its first
  Python call, through a one-shot ``threading.setprofile`` hook. A thread already
  running at ``start`` gets it the first time it enters a ``record_function``,
  a ``range_push`` or a backward (and, on Python 3.12+, on its next Python call,
  through ``threading.setprofile_all_threads``; not tested on 3.11 machines).
  Such a late push is skipped on a thread whose mode stack is not empty, so a
  user's ``with Mode():`` there can never pop ours by mistake.
- **Stop** restores every patched attribute, pops the mode on the calling
  thread, and makes it inert everywhere else: another thread that still holds
  it pops it right after its next op (through a one-shot profile hook).
  A range still open at stop ends at stop, with ``FLAG_UNFINISHED`` set, as the
  native collector does. Codes dynamo met while recording get its default
  strategy back, since torch 2.13 would never compile them (``collect.python.dynamo``).
- **Higher-order ops** (``torch.cond``) reach the mode as one op; on torch 2.4 to
  2.8, which do not route them to a mode, ``collect.python.hops`` registers a rule.

What it misses compared with torch.profiler:

- Everything above the Python dispatch key: ``aten::linear``, ``aten::matmul``,
  ``aten::cross_entropy`` and other CompositeImplicit ops (only what they
  decompose into is seen), and the autograd-level op records.
- Ops called from inside a kernel (``aten::addmm`` calling ``aten::empty``,
  ``aten::t`` calling ``aten::transpose``): only the outermost op is seen.
- Forward ``seq_nr``s (so no forward/backward links), ``fwd_thread_id``,
  ``torch::autograd::GraphRoot``, and backward that a C++ caller or a
  ``from torch.autograd import grad`` alias starts.
- Ops on threads that never joined: threads that ran before ``start`` and
  enter none of the above (on Python < 3.12), threads with a mode of their own
  already pushed, and C++ threads.
- C++ ``RECORD_FUNCTION`` ranges (``_RecordFunctionFast`` ones are recorded, as
  user ranges: profiler_flag.py); a ``record_function`` whose end was moved to a future
  (``_call_end_callbacks_on_future``) ends at ``__exit__`` here.
- An op still running on another thread at the moment of ``stop``.
- The inside of a higher-order op (``torch.cond``): one record, named ``cond``.
- Fused kernels: while a dispatch mode is active, dynamo does not compile new
  frames (they run eagerly, and their aten ops are recorded), and code compiled
  earlier shows only the aten ops its compiled graph still calls.

``start``/``stop`` must nest with a user's own ``with Mode():`` on the same
thread, as any two dispatch modes must. The first ``start`` in a process
imports ``torch._dynamo``, which torch's dispatch-mode wrapper needs; later
starts skip it. Each recorded op pays for a Python call, which the native
collector does not.

The parts: ``mode`` (the dispatch mode), ``recording`` (one
recording's state and the patches that feed it), ``inputs`` (argument
encoding), ``rows`` (per-thread buffers), ``backward``,
``dynamo`` and ``hops``.

Example::

    >>> import torch
    >>> c = PythonCollector()
    >>> c.start(record_shapes=True)
    >>> y = torch.ones(2, 3) @ torch.ones(3, 4)
    >>> raw = c.stop()
    >>> "aten::mm" in raw.names, raw.collector
    (True, 'python')
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import List, Optional

import numpy as np

from opscope.arguments import check_name
from opscope.collect.python.hops import route_higher_order_ops
from opscope.collect.python.inputs import int64_blob
from opscope.collect.python.mode import OpMode as _OpMode
from opscope.collect.python.recording import Recording
from opscope.collect.python.rows import close_row, monotonic_ns
from opscope.collect.thread_names import ThreadNames
from opscope.model.records import FLAG_UNFINISHED, NO_STACK, RawSession, records_from_rows


class PythonCollector:
    """Records aten ops, ranges and backward nodes from Python; see the module doc.

    >>> c = PythonCollector()
    >>> c.is_recording()
    False
    """

    name = "python"
    _handles = itertools.count(1)

    def __init__(self):
        self._rec: Optional[Recording] = None
        self._start_ns = 0
        self._epoch_offset_ns = 0

    @staticmethod
    def now_ns() -> int:
        """CLOCK_MONOTONIC in ns, the clock of every record (as the native collector)."""
        return monotonic_ns()

    def is_recording(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._rec is not None and self._rec.active

    def start(self, *, record_shapes: bool = False, profile_memory: bool = False,
              with_stack: bool = False) -> None:
        """Start recording. ``profile_memory`` needs the native collector; here it
        records nothing (see docs/guide.md). ``with_stack`` records ops' Python stacks."""
        if self._rec is not None:
            raise RuntimeError("opscope python collector is already recording; call stop() first")
        rec = Recording(bool(record_shapes), bool(with_stack))
        try:
            route_higher_order_ops(_OpMode)
            rec.prime()  # imports torch._dynamo, whose registry dynamo_codes wraps
            rec.dynamo_codes.install(rec.mode)
            rec.install()
        except BaseException:
            try:
                rec.uninstall()
                rec.dynamo_codes.uninstall()
            except Exception:
                pass  # the install error is the one to report
            raise
        self._epoch_offset_ns = time.time_ns() - monotonic_ns()
        self._thread_names = ThreadNames()
        self._thread_names.start()
        self._start_ns = monotonic_ns()
        rec.active = True
        self._rec = rec

    def stop(self) -> RawSession:
        """Stop recording; every row of every thread, as a RawSession (open ranges end now)."""
        rec = self._rec
        if rec is None:
            raise RuntimeError("opscope python collector is not recording; call start() first")
        rec.active = False
        stop_ns = monotonic_ns()
        self._rec = None
        rec.uninstall()
        rec.dynamo_codes.uninstall()
        rows = []
        stack_ids: List[int] = []
        for buf in list(rec.buffers):
            if rec.with_stack:
                stacks = dict(buf.stacks)
                stack_ids.extend(stacks.get(j, NO_STACK) for j in range(len(buf.rows)))
            for row in list(buf.rows):
                if row[9] & FLAG_UNFINISHED:
                    row = list(row)
                    row[1] = stop_ns
                rows.append(tuple(row))
        return RawSession(
            records=records_from_rows(rows),
            inputs=[int64_blob(buf.inputs) for buf in rec.buffers],
            thread_ids=[buf.os_tid for buf in rec.buffers],
            names=list(rec.names),
            start_ns=self._start_ns,
            stop_ns=stop_ns,
            epoch_offset_ns=self._epoch_offset_ns,
            collector=self.name,
            process_id=os.getpid(),
            stack_ids=np.asarray(stack_ids, dtype=np.int64) if rec.with_stack else None,
            stack_table=rec.stack_table() if rec.with_stack else None,
            thread_names=self._thread_names.names(),
        )

    def forget_after_fork(self) -> None:
        """In a forked child: stop recording into the parent's copy and free it.

        The patches are undone and the mode made inert (it pops itself from
        this thread after its next op if it cannot be removed now); the rows
        are dropped. The child can then start a collector of its own.
        """
        rec, self._rec = self._rec, None
        if rec is None:
            return
        rec.active = False
        rec._lock = threading.Lock()  # a parent thread may have held it at the fork
        rec.buffers = []
        rec.ranges.clear()
        rec.rf_rows.clear()
        rec._local = threading.local()
        rec.uninstall()
        rec.dynamo_codes.uninstall()

    def range_push(self, name: str) -> int:
        """Open a user range on this thread; returns the handle for ``range_pop``."""
        check_name("record_function", "name", name)
        handle = next(self._handles)
        rec = self._rec
        if rec is not None and rec.active:
            rec.ranges[handle] = rec.range_begin(str(name))
        return handle

    def range_pop(self, handle: int) -> None:
        """Close the user range ``range_push`` opened (an unknown handle does nothing)."""
        end = monotonic_ns()
        rec = self._rec
        row = rec.ranges.pop(handle, None) if rec is not None else None
        if row is not None:
            close_row(row, end)
