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
  strategy back, since torch 2.13 would never compile them (``collect.python_dynamo``).
- **Higher-order ops** (``torch.cond``) reach the mode as one op; on torch 2.4 to
  2.8, which do not route them to a mode, ``collect.python_hops`` registers a rule.

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
imports ``torch._dynamo`` (a few seconds), which torch's dispatch-mode wrapper
needs; later starts are cheap. A recorded op costs about 10-20 us more.

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

import functools
import itertools
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode, _get_current_dispatch_mode_stack, _len_torch_dispatch_stack, _pop_mode,
    _push_mode,
)

from opscope.arguments import check_name
from opscope.collect.input_encoding import scalar_type_index, encode_inputs
from opscope.collect.python_backward import BackwardHooks
from opscope.collect.python_dynamo import DynamoCodesMet
from opscope.collect.python_hops import route_higher_order_ops
from opscope.collect.python_rows import ThreadBuffer, close_row, monotonic_ns, open_row
from opscope.collect.stack_frames import FrameFormatter
from opscope.model.records import (
    FLAG_UNFINISHED, NO_INPUTS, NO_STACK, SCOPE_FUNCTION, SCOPE_USER,
    RawSession, records_from_rows,
)

_REMOVAL_TRIES = 10_000  # profile events to wait for a stashed mode to come back
_SKIP = -1  # name id of ops we never record (record_function's own profiler:: ops)
MAX_STACK_DEPTH = 128  # frames kept per stack, innermost first (as observer.cpp)
# c10::Layout and c10::MemoryFormat values, as torch.profiler's inputs show them
_ENUM_VALUES = {
    torch.strided: 0, torch.sparse_coo: 1, torch.sparse_csr: 2, torch._mkldnn: 3,
    torch.sparse_csc: 4, torch.sparse_bsr: 5, torch.sparse_bsc: 6,
    torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
    torch.channels_last_3d: 3,
}


class _OpMode(TorchDispatchMode):
    """Times each aten op handed to it; inert once its recording has stopped."""

    # Else a higher-order op (torch.cond, flex_attention...) raises under the mode;
    # torch < 2.9 ignores the flag, and collect.python_hops registers a rule instead.
    supports_higher_order_operators = True

    def __init__(self, recording: "_Recording"):
        super().__init__()
        self._rec = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = self._rec
        if kwargs is None:
            kwargs = {}
        if not rec.active:
            if rec.pushed:
                rec.schedule_removal()
            return func(*args, **kwargs)
        name_id = rec.op_ids.get(func)
        if name_id is None:
            name_id = rec.op_name_id(func)
        if name_id == _SKIP:
            return func(*args, **kwargs)
        buf = rec.buffer()
        offset = rec.encode(buf, func, args, kwargs) if rec.record_shapes else NO_INPUTS
        stack = rec.stack_id(sys._getframe(1)) if rec.with_stack else -1
        start = monotonic_ns()
        try:
            return func(*args, **kwargs)
        finally:
            if stack >= 0:
                buf.stacks[len(buf.rows)] = stack
            buf.rows.append((start, monotonic_ns(), -1, name_id, buf.index, 0, buf.index + 1,
                             offset, SCOPE_FUNCTION, 0, 0))


@functools.lru_cache(maxsize=None)
def _is_dispatch_wrapper(code) -> bool:
    """Frames between an op call and ``__torch_dispatch__``: torch's dynamo-disable
    wrapper around dispatch modes. They are not where the op was called."""
    name = code.co_filename.replace(os.sep, "/")
    return name.endswith(("torch/_dynamo/eval_frame.py", "torch/_compile.py"))


def _remove_mode(mode: TorchDispatchMode) -> bool:
    """Take ``mode`` off this thread's stack, keeping the modes above it in order."""
    if not any(m is mode for m in _get_current_dispatch_mode_stack()):
        return False
    above = []
    while _len_torch_dispatch_stack() > 0:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)
    return True


class _Recording(BackwardHooks):
    """The state of one start..stop: buffers, names, and what was patched."""

    def __init__(self, record_shapes: bool, with_stack: bool = False):
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.stack_ids: Dict[tuple, int] = {}  # ((code, line), ...) innermost first -> id
        self.active = False
        self.pushed = False  # the mode went onto some thread's stack
        self.mode = _OpMode(self)
        self.names: List[str] = []
        self.name_ids: Dict[str, int] = {}
        self.op_ids: Dict[Any, int] = {}
        self.arg_specs: Dict[Any, Optional[tuple]] = {}
        self.buffers: List[ThreadBuffer] = []
        self.ranges: Dict[int, list] = {}  # range_push handle -> row
        self.rf_rows: Dict[int, List[list]] = {}  # id(record_function) -> open rows
        self._local = threading.local()
        self._lock = threading.Lock()
        self._undo: List[Callable[[], None]] = []
        self.thread_hook = self._on_new_thread  # one bound object, compared by identity
        self._prev_thread_hook: Optional[Callable] = None
        self._running_at_start = frozenset(t.ident for t in threading.enumerate())
        self.dynamo_codes = DynamoCodesMet()

    # -- stacks -------------------------------------------------------------
    def stack_id(self, frame) -> int:
        """Id of the Python stack from ``frame`` outwards (interned)."""
        key = []
        while frame is not None and _is_dispatch_wrapper(frame.f_code):
            frame = frame.f_back
        while frame is not None and len(key) < MAX_STACK_DEPTH:
            key.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        key = tuple(key)
        sid = self.stack_ids.get(key)
        if sid is None:
            with self._lock:
                sid = self.stack_ids.setdefault(key, len(self.stack_ids))
        return sid

    def stack_table(self) -> List[List[str]]:
        """Frames (innermost first) per stack id, as torch prints them."""
        fmt = FrameFormatter()
        table: List[List[str]] = [[] for _ in self.stack_ids]
        for key, sid in self.stack_ids.items():
            table[sid] = [fmt.format(code.co_filename, line, code.co_name) for code, line in key]
        return table

    # -- names and threads ------------------------------------------------
    def intern(self, name: str) -> int:
        sid = self.name_ids.get(name)
        if sid is None:
            with self._lock:
                sid = self.name_ids.setdefault(name, len(self.names))
                if sid == len(self.names):
                    self.names.append(name)
        return sid

    def op_name_id(self, func) -> int:
        schema = getattr(func, "_schema", None)
        name = schema.name if schema is not None else str(func)
        sid = _SKIP if name.startswith("profiler::") else self.intern(name)
        self.op_ids[func] = sid
        return sid

    def buffer(self) -> ThreadBuffer:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            with self._lock:
                buf = ThreadBuffer(len(self.buffers))
                self.buffers.append(buf)
            self._local.buf = buf
        return buf

    def join_thread(self) -> ThreadBuffer:
        """This thread's buffer; a thread seen for the first time also gets the mode."""
        if getattr(self._local, "buf", None) is None:
            if _len_torch_dispatch_stack() == 0:
                self.push_mode()
        return self.buffer()

    def push_mode(self) -> None:
        self.pushed = True
        _push_mode(self.mode)

    def prime(self) -> None:
        """Call the mode once, unpushed and inactive, on a no-op: torch wraps
        ``__torch_dispatch__`` in a dynamo-disable that imports torch._dynamo on its
        first call (seconds), which must not land inside the first recorded op."""
        self.mode.__torch_dispatch__(lambda: None, (), (), {})

    def _on_new_thread(self, frame, event, arg):
        # One-shot: hand a new thread to the hook threading had before us; a thread
        # that was already running (3.12+) had none we know of.
        prev = None if threading.get_ident() in self._running_at_start else self._prev_thread_hook
        sys.setprofile(prev)
        if self.active:
            self.join_thread()
        if prev is not None:
            prev(frame, event, arg)

    def schedule_removal(self) -> None:
        """Called by the inert mode: pop it from this thread after the current op."""
        if sys.getprofile() is None:
            self._local.removal_tries = 0
            sys.setprofile(self._removal_hook)

    def _removal_hook(self, frame, event, arg):
        # The mode is absent while its own dispatch has it stashed; if it stays
        # absent (someone else popped it), stop looking.
        tries = self._local.removal_tries = getattr(self._local, "removal_tries", 0) + 1
        if _remove_mode(self.mode) or tries > _REMOVAL_TRIES:
            sys.setprofile(None)

    # -- inputs -----------------------------------------------------------
    def encode(self, buf: ThreadBuffer, func, args, kwargs) -> int:
        spec = self.arg_specs.get(func, False)
        if spec is False:
            spec = self.arg_specs[func] = _arg_spec(func)
        values = list(args)
        if spec is not None:  # the full schema, defaults included, as RecordFunction sees it
            values.extend(kwargs.get(name, default) for name, default in spec[len(args):])
        else:
            values.extend(kwargs.values())
        encoded: List[int] = []
        try:
            encode_inputs([_ivalue_like(v) for v in values], encoded)
        except Exception:  # symbolic shapes and other values that have no int encoding
            return NO_INPUTS
        offset = len(buf.inputs)
        buf.inputs.extend(encoded)
        return offset

    # -- ranges -----------------------------------------------------------
    def range_begin(self, name: str) -> list:
        buf = self.join_thread()
        row = open_row(buf, 0, self.intern(name), SCOPE_USER)
        buf.rows.append(row)
        row[0] = monotonic_ns()
        return row

    def rf_enter(self, rf) -> None:
        if self.active:
            self.rf_rows.setdefault(id(rf), []).append(self.range_begin(str(rf.name)))

    def rf_exit(self, rf) -> None:
        end = monotonic_ns()
        rows = self.rf_rows.get(id(rf))
        if rows:
            close_row(rows.pop(), end)
            if not rows:
                del self.rf_rows[id(rf)]

    # -- install / uninstall ----------------------------------------------
    def patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.attr`` by ``make(original)`` until ``uninstall``."""
        original = owner.__dict__[attr]
        wrapper = make(original)
        setattr(owner, attr, wrapper)

        def undo():
            if owner.__dict__.get(attr) is wrapper:  # leave a later tool's patch alone
                setattr(owner, attr, original)

        self._undo.append(undo)

    def install(self) -> None:
        rec = self
        rf_cls = torch.autograd.profiler.record_function

        def wrap_enter(original):
            def __enter__(rf):
                out = original(rf)
                rec.rf_enter(rf)
                return out
            return __enter__

        def wrap_exit(original):
            def __exit__(rf, exc_type, exc_value, traceback):
                rec.rf_exit(rf)
                return original(rf, exc_type, exc_value, traceback)
            return __exit__

        def wrap_backward(root_param):
            def make(original):
                @functools.wraps(original)
                def wrapper(*args, **kwargs):
                    return rec.run_backward(original, root_param, args, kwargs)
                return wrapper
            return make

        self.patch(rf_cls, "__enter__", wrap_enter)
        self.patch(rf_cls, "__exit__", wrap_exit)
        self.patch(torch.autograd, "backward", wrap_backward("tensors"))
        self.patch(torch.autograd, "grad", wrap_backward("outputs"))
        self._prev_thread_hook = threading.getprofile()
        if hasattr(threading, "setprofile_all_threads") and sys.getprofile() is None:
            threading.setprofile_all_threads(self.thread_hook)  # threads already running too
            sys.setprofile(None)
        else:
            threading.setprofile(self.thread_hook)
        self._undo.append(self._restore_thread_hook)
        self.push_mode()
        self._undo.append(lambda: _remove_mode(self.mode))
        self.buffer()

    def _restore_thread_hook(self) -> None:
        if threading.getprofile() is self.thread_hook:
            threading.setprofile(self._prev_thread_hook)

    def uninstall(self) -> None:
        """Undo every install step, newest first; each runs even if one fails."""
        errors = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as e:  # keep undoing the rest
                errors.append(e)
        if errors:
            raise errors[0]


def _arg_spec(func) -> Optional[tuple]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    return tuple((a.name, a.default_value if a.has_default_value() else None)
                 for a in schema.arguments)


def _ivalue_like(v: object) -> object:
    """dtype/layout/memory_format as the ints that RecordFunction's IValues hold."""
    if isinstance(v, torch.dtype):
        return scalar_type_index(v)
    if isinstance(v, (torch.layout, torch.memory_format)):
        return _ENUM_VALUES.get(v, v)
    return v


def _int64_blob(values: List[int]) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:  # a Python int past int64: keep its low 64 bits
        return np.asarray([(x + 2**63) % 2**64 - 2**63 for x in values], dtype=np.int64)


class PythonCollector:
    """Records aten ops, ranges and backward nodes from Python; see the module doc.

    >>> c = PythonCollector()
    >>> c.is_recording()
    False
    """

    name = "python"
    _handles = itertools.count(1)

    def __init__(self):
        self._rec: Optional[_Recording] = None
        self._start_ns = 0
        self._epoch_offset_ns = 0

    @staticmethod
    def now_ns() -> int:
        """CLOCK_MONOTONIC in ns, the clock of every record (as the native collector)."""
        return monotonic_ns()

    def is_recording(self) -> bool:
        return self._rec is not None and self._rec.active

    def start(self, *, record_shapes: bool = False, profile_memory: bool = False,
              with_stack: bool = False) -> None:
        """Start recording. ``profile_memory`` needs the native collector; here it
        records nothing (see the README). ``with_stack`` records ops' Python stacks."""
        if self._rec is not None:
            raise RuntimeError("opscope python collector is already recording; call stop() first")
        rec = _Recording(bool(record_shapes), bool(with_stack))
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
        self._start_ns = monotonic_ns()
        rec.active = True
        self._rec = rec

    def stop(self) -> RawSession:
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
            inputs=[_int64_blob(buf.inputs) for buf in rec.buffers],
            thread_ids=[buf.os_tid for buf in rec.buffers],
            names=list(rec.names),
            start_ns=self._start_ns,
            stop_ns=stop_ns,
            epoch_offset_ns=self._epoch_offset_ns,
            collector=self.name,
            process_id=os.getpid(),
            stack_ids=np.asarray(stack_ids, dtype=np.int64) if rec.with_stack else None,
            stack_table=rec.stack_table() if rec.with_stack else None,
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
        end = monotonic_ns()
        rec = self._rec
        row = rec.ranges.pop(handle, None) if rec is not None else None
        if row is not None:
            close_row(row, end)
