"""The process-group calls the job's Python makes while a window records.

torch's flight recorder (``collect/job/flight_recorder.py``) numbers every
collective, but on gloo it keeps no point-to-point op, and the Python stacks
it holds cost seconds to read (its symbolizer imports ``torch._inductor``).
So, while a window records, opscope wraps the methods of torch's
``ProcessGroup`` that torch.distributed's Python functions end in
(``dist.send`` and ``dist.isend`` call ``group.send``, ``dist.all_reduce``
calls ``group.allreduce``...). Each call notes, in one row:

``[group name, sequence number, "c10d::<method>", entered (Unix ns), group
description, input elements, output elements, dtype, call site, is
point-to-point, returned (Unix ns), peer rank]``

- the sequence number is torch's own, the group's
  ``_get_sequence_number_for_group()`` after the call (gloo counts every op of
  the group, point-to-point ones included), kept for point-to-point ops only: a
  collective's comes from the recorder, whose count skips them;
- the call site is the innermost frame that is not torch's, opscope's or a
  library's (``model.collective_facts.user_call_site``), read from the live
  frames (a few microseconds; no stack is symbolized);
- the peer is the global rank sent to or received from (None for a receive
  from any source).

The wrappers sit on the class, so groups made during the window are covered;
calls made from C++ (DDP's reducer) are not seen here, and the recorder has
them. A wrapper never raises into the job: its own bookkeeping is guarded, the
wrapped call's errors pass through untouched. They come off at stop
(``analysis.flight_recorder`` gives the rows to the ops they belong to); a
window runs them as a probe (``collect.probes.ProcessGroupCallsProbe``).

Example::

    >>> calls = ProcessGroupCalls()
    >>> calls.install()   # where torch.distributed is available: its methods wrapped
    >>> calls.uninstall()
    []
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from opscope.model.collective_facts import user_call_site

MAX_ROWS = 200_000  # a window keeps at most these calls (the first ones)
MAX_FRAMES = 64  # frames walked outwards looking for the user's call site

# method -> (index of its input tensors, index of its output tensors, point-to-point):
# the arguments of torch's ProcessGroup methods (torch/csrc/distributed/c10d/init.cpp)
METHODS: Dict[str, Tuple[Optional[int], Optional[int], bool]] = {
    "send": (0, 0, True), "recv": (0, 0, True), "recv_anysource": (0, 0, True),
    "allreduce": (0, 0, False), "allreduce_coalesced": (0, 0, False),
    "broadcast": (0, 0, False), "reduce": (0, 0, False),
    "allgather": (1, 0, False), "_allgather_base": (1, 0, False),
    "allgather_coalesced": (1, 0, False), "allgather_into_tensor_coalesced": (1, 0, False),
    "reduce_scatter": (1, 0, False), "_reduce_scatter_base": (1, 0, False),
    "reduce_scatter_tensor_coalesced": (1, 0, False),
    "alltoall": (1, 0, False), "alltoall_base": (1, 0, False),
    "gather": (1, 0, False), "scatter": (1, 0, False), "barrier": (None, None, False),
}
# torch dtype name -> c10's ScalarType name, the flight recorder's and torch's "dtype" arg
SCALAR_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
    "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble",
    "complex32": "ComplexHalf", "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
    "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
}


def _count(value: Any, tensor_type: type, first: List[Any], depth: int = 0) -> int:
    """Elements of the tensors in an argument (a tensor, or lists of them, two deep); the
    first tensor met goes into ``first``."""
    if isinstance(value, tensor_type):
        if not first:
            first.append(value)
        return value.numel()
    if depth < 2 and isinstance(value, (list, tuple)):
        return sum(_count(item, tensor_type, first, depth + 1) for item in value)
    return 0


class _CallSites:
    """The innermost user frame of a call, with each file's verdict kept."""

    def __init__(self) -> None:
        self._library: Dict[str, bool] = {}

    def site(self, frame: Any) -> Optional[str]:
        for _ in range(MAX_FRAMES):
            if frame is None:
                return None
            code = frame.f_code
            name = code.co_filename
            library = self._library.get(name)
            if library is None:
                library = self._library[name] = user_call_site([name + "(0): f"]) is None
            if not library:
                return f"{name}({frame.f_lineno}): {code.co_name}"
            frame = frame.f_back
        return None


class ProcessGroupCalls:
    """Wrappers on ``ProcessGroup``'s methods, from ``install()`` to ``uninstall() -> rows``."""

    def __init__(self) -> None:
        self.rows: List[tuple] = []
        self._originals: Dict[str, Any] = {}
        self._class: Any = None
        self._active = False
        self._sites = _CallSites()
        self._global_ranks: Dict[Tuple[int, int], Optional[int]] = {}
        self._groups: Dict[int, Tuple[Any, str, str]] = {}  # id -> (group, name, desc)
        self._dtypes: Dict[Any, Optional[str]] = {}
        self._tensor_type: type = type(None)

    def install(self) -> None:
        """Wrap the methods, where torch.distributed is imported and available."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        from torch import Tensor
        from torch._C._distributed_c10d import ProcessGroup

        self._tensor_type = Tensor
        self._class, self._active = ProcessGroup, True
        for method, spec in METHODS.items():
            original = ProcessGroup.__dict__.get(method)
            if original is None:
                continue
            self._originals[method] = original
            setattr(ProcessGroup, method, self._wrapper(method, getattr(ProcessGroup, method),
                                                        spec))

    def uninstall(self) -> List[list]:
        """Put the methods back (those still ours); the rows, kept in ``rows``, as lists."""
        self._active = False
        cls, originals, self._originals = self._class, self._originals, {}
        for method, original in originals.items():
            current = cls.__dict__.get(method)
            if getattr(current, "_opscope_wrapper", False):
                setattr(cls, method, original)
        self._groups.clear()
        self._global_ranks.clear()
        self.rows = [list(row) for row in self.rows]
        return self.rows

    def _wrapper(self, method: str, original: Callable[..., Any],
                 spec: Tuple[Optional[int], Optional[int], bool]) -> Callable[..., Any]:
        calls = self

        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            if not calls._active:
                return original(group, *args, **kwargs)
            entered = time.time_ns()
            result = original(group, *args, **kwargs)
            try:
                calls._note(method, spec, group, args, entered, sys._getframe(1))
            except Exception:  # noqa: BLE001  (never harm the job: this call goes unnoted)
                pass
            return result

        wrapper._opscope_wrapper = True  # type: ignore[attr-defined]
        wrapper.__name__ = wrapper.__qualname__ = method
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    def _note(self, method: str, spec: Tuple[Optional[int], Optional[int], bool], group: Any,
              args: Tuple[Any, ...], entered: int, frame: Any) -> None:
        returned = time.time_ns()
        if len(self.rows) >= MAX_ROWS:
            return
        in_index, out_index, p2p = spec
        first: List[Any] = []
        n_in = n_out = 0
        if in_index is not None:
            n_in = _count(args[in_index], self._tensor_type, first) \
                if in_index < len(args) else None
            n_out = _count(args[out_index], self._tensor_type, first) \
                if out_index is not None and out_index < len(args) else None
        dtype = None
        if first:
            key = first[0].dtype
            if key not in self._dtypes:
                self._dtypes[key] = SCALAR_NAMES.get(str(key).rpartition(".")[2])
            dtype = self._dtypes[key]
        known = self._groups.get(id(group))
        if known is None:
            known = self._groups[id(group)] = (
                group, str(group.group_name), str(getattr(group, "group_desc", "") or ""))
        seq = peer = None
        if p2p:
            seq = int(group._get_sequence_number_for_group())
            if method != "recv_anysource" and len(args) > 1 and type(args[1]) is int:
                peer = self._global_rank(group, args[1])
        # a tuple: of strings, ints and None only, Python's collector stops tracking it
        self.rows.append((known[1], seq, "c10d::" + method, entered, known[2], n_in, n_out,
                          dtype, self._sites.site(frame), p2p, returned, peer))

    def _global_rank(self, group: Any, group_rank: int) -> Optional[int]:
        key = (id(group), group_rank)
        if key not in self._global_ranks:
            try:
                from torch.distributed import get_global_rank

                self._global_ranks[key] = int(get_global_rank(group, group_rank))
            except Exception:  # noqa: BLE001  (a group torch no longer knows: no peer)
                self._global_ranks[key] = None
        return self._global_ranks[key]
