"""Synthetic sessions for tests: ops with fixed times, no torch needed.

Describe ops with :class:`Op` (times in microseconds on a fake collector
clock) and turn them into an analysed ``ProfileSession`` with
:func:`make_session`. Inputs use :class:`TensorSpec` for tensors and plain
Python values for scalars, int lists and strings, encoded the way the
collectors encode them.

Example::

    >>> s = make_session([Op("my_step", 0, 100, scope=SCOPE_USER),
    ...                   Op("aten::mm", 10, 30, inputs=[TensorSpec((2, 3))])])
    >>> [s.table.name(i) for i in range(len(s.table))], s.table.parent.tolist()
    (['my_step', 'aten::mm'], [-1, 0])
    >>> s.table.inputs(1).shapes
    [[2, 3]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from opscope.analysis.build import build_session
from opscope.model.records import (
    INPUT_TENSOR, NO_INPUTS, SCALAR_TYPE_NAMES, SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION,
    SCOPE_USER, RawSession, encode_plain_value, records_from_rows,
)
from opscope.model.session import OPTION_NAMES, ProfileSession

__all__ = ["Op", "TensorSpec", "make_session", "SCOPE_FUNCTION", "SCOPE_BACKWARD_FUNCTION",
           "SCOPE_USER", "CLOCK_BASE_NS", "EPOCH_OFFSET_NS"]

CLOCK_BASE_NS = 5_000_000_000_000  # the fake monotonic clock reads 5000 s at time 0
EPOCH_OFFSET_NS = 1_700_000_000_123_456_789  # fake clock + this = Unix ns


@dataclass
class TensorSpec:
    """A tensor input: shape, strides (contiguous by default), dtype name."""

    shape: Sequence[int]
    strides: Optional[Sequence[int]] = None
    dtype: str = "float"

    def encode(self) -> List[int]:
        shape = list(self.shape)
        strides = list(self.strides) if self.strides is not None else _contiguous(shape)
        return [INPUT_TENSOR, len(shape), *shape, *strides, SCALAR_TYPE_NAMES.index(self.dtype)]


@dataclass
class Op:
    """One op or range. ``start_us``/``end_us`` are on the fake clock.

    ``thread`` is the collector's thread index (its OS id comes from
    ``make_session(thread_ids=...)``); ``stack`` is innermost-first.
    """

    name: str
    start_us: float
    end_us: float
    thread: int = 0
    scope: int = SCOPE_FUNCTION
    seq: int = -1
    fwd_thread: int = 0
    rf_thread: int = 1
    inputs: Optional[list] = None
    stack: Optional[List[str]] = None
    flags: int = 0


def _contiguous(shape: List[int]) -> List[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def _encode(values: list) -> List[int]:
    out = [len(values)]
    for v in values:
        if isinstance(v, TensorSpec):
            out.extend(v.encode())
        else:
            encode_plain_value(v, out)
    return out


def _ns(us: float) -> int:
    return CLOCK_BASE_NS + int(round(us * 1000))


def make_session(ops: Sequence[Op], *, thread_ids: Sequence[int] = (4242,),
                 process_id: int = 4242, start_us: Optional[float] = None,
                 stop_us: Optional[float] = None, epoch_offset_ns: int = EPOCH_OFFSET_NS,
                 options: Optional[Dict[str, bool]] = None,
                 metadata: Optional[Dict[str, str]] = None) -> ProfileSession:
    """Build an analysed session from ``ops``.

    The window defaults to 1 us before the first op to 1 us after the last.
    Stacks are given per op and come back aligned with the sorted table; an
    op folded into a same-name parent cannot carry a stack (ValueError).
    """
    names: List[str] = []
    name_ids: Dict[str, int] = {}
    blobs: List[List[int]] = [[] for _ in thread_ids]
    rows = []
    for op in ops:
        nid = name_ids.setdefault(op.name, len(names))
        if nid == len(names):
            names.append(op.name)
        offset = NO_INPUTS
        if op.inputs is not None:
            offset = len(blobs[op.thread])
            blobs[op.thread].extend(_encode(op.inputs))
        rows.append((_ns(op.start_us), _ns(op.end_us), op.seq, nid, op.thread, op.fwd_thread,
                     op.rf_thread, offset, op.scope, op.flags, 0))
    if start_us is None:
        start_us = min((op.start_us for op in ops), default=0.0) - 1
    if stop_us is None:
        stop_us = max((op.end_us for op in ops), default=0.0) + 1
    records = records_from_rows(rows)
    raw = RawSession(records, [np.asarray(b, dtype=np.int64) for b in blobs], list(thread_ids),
                     names, _ns(start_us), _ns(stop_us), epoch_offset_ns,
                     process_id=process_id)
    opts = {k: False for k in OPTION_NAMES}
    opts.update(options or {})
    session = build_session(raw, options=opts, metadata=dict(metadata or {}))
    if any(op.stack for op in ops):
        if len(session.table) != len(ops):
            raise ValueError("an op with a stack was folded into a same-name parent")
        rec = raw.records
        order = np.lexsort((-rec["end_ns"], rec["start_ns"]))
        session.stacks = [ops[k].stack for k in order.tolist()]
    return session
