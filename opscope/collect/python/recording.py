"""The state of one Python-collector recording, and the patches that feed it.

A ``Recording`` holds what one ``start``..``stop`` gathers: interned names and
stacks, one row buffer per thread (``rows``), the open ranges. It installs
the hooks that fill them (the dispatch mode of ``mode``, the wrapped
``record_function`` and backward calls, the new-thread hook) and undoes each.

>>> rec = Recording(record_shapes=False)
>>> rec.intern("step"), rec.intern("step"), rec.names
(0, 0, ['step'])
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.utils._python_dispatch import _len_torch_dispatch_stack, _push_mode

from opscope.collect.python.backward import BackwardHooks
from opscope.collect.python.dynamo import DynamoCodesMet
from opscope.collect.python.inputs import encode_call
from opscope.collect.python.mode import SKIP, OpMode, is_dispatch_wrapper, remove_mode
from opscope.collect.python.rows import ThreadBuffer, close_row, monotonic_ns, open_row
from opscope.collect.stack_frames import FrameFormatter
from opscope.model.records import SCOPE_USER

_REMOVAL_TRIES = 10_000  # profile events to wait for a stashed mode to come back
MAX_STACK_DEPTH = 128  # frames kept per stack, innermost first (as observer.cpp)


class Recording(BackwardHooks):
    """The state of one start..stop: buffers, names, and what was patched."""

    def __init__(self, record_shapes: bool, with_stack: bool = False):
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.stack_ids: Dict[tuple, int] = {}  # ((code, line), ...) innermost first -> id
        self.active = False
        self.pushed = False  # the mode went onto some thread's stack
        self.mode = OpMode(self)
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
        while frame is not None and is_dispatch_wrapper(frame.f_code):
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
            table[sid] = fmt.stack((code.co_filename, line, code.co_name) for code, line in key)
        return table

    # -- names and threads ------------------------------------------------
    def intern(self, name: str) -> int:
        """The id of ``name`` in this recording's names (added on first sight)."""
        sid = self.name_ids.get(name)
        if sid is None:
            with self._lock:
                sid = self.name_ids.setdefault(name, len(self.names))
                if sid == len(self.names):
                    self.names.append(name)
        return sid

    def op_name_id(self, func) -> int:
        """The name id of an aten op (its schema name), or SKIP for ``profiler::`` ops."""
        schema = getattr(func, "_schema", None)
        name = schema.name if schema is not None else str(func)
        sid = SKIP if name.startswith("profiler::") else self.intern(name)
        self.op_ids[func] = sid
        return sid

    def buffer(self) -> ThreadBuffer:
        """This thread's row buffer (made on the thread's first record)."""
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
        """Put the dispatch mode on this thread's mode stack."""
        self.pushed = True
        _push_mode(self.mode)

    def prime(self) -> None:
        """Call the mode once, unpushed and inactive, on a no-op: torch wraps
        ``__torch_dispatch__`` in a dynamo-disable that imports torch._dynamo on its
        first call, which must not land inside the first recorded op."""
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
        if remove_mode(self.mode) or tries > _REMOVAL_TRIES:
            sys.setprofile(None)

    # -- inputs -----------------------------------------------------------
    def encode(self, buf: ThreadBuffer, func, args, kwargs) -> int:
        """Encode the call's inputs into ``buf`` (see ``inputs.encode_call``)."""
        return encode_call(self.arg_specs, buf, func, args, kwargs)

    # -- ranges -----------------------------------------------------------
    def range_begin(self, name: str) -> list:
        """Open a user range row on this thread and return it (closed by ``close_row``)."""
        buf = self.join_thread()
        row = open_row(buf, 0, self.intern(name), SCOPE_USER)
        buf.rows.append(row)
        row[0] = monotonic_ns()
        return row

    def rf_enter(self, rf) -> None:
        """A ``record_function`` was entered: open its range."""
        if self.active:
            self.rf_rows.setdefault(id(rf), []).append(self.range_begin(str(rf.name)))

    def rf_exit(self, rf) -> None:
        """A ``record_function`` was left: close its innermost open range."""
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
        """Wrap ``record_function``, backward and grad, hook new threads, push the mode."""
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
        self._undo.append(lambda: remove_mode(self.mode))
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
