"""The collectives one rank issued, read from its session's events.

A collective shows in two places (names in ``opscope.model.torch_names``):
the calling thread's dispatcher op (``c10d::allreduce_``), which for an async
op times only the enqueue, and the backend's range (``gloo:all_reduce`` on a
gloo worker thread, ``nccl:all_reduce``), which spans the real work, waiting
for the peers included. The n-th dispatcher op of a kind is paired with the
first unpaired backend range of that kind starting at or after it; a
dispatcher op without a range, or a range without an op (a trace that lacks
one thread), is a collective on its own.

Per collective: the arrival (the dispatcher op's start, else the range's),
the duration the wait/transfer rule splits (the range's, else the op's), the
bytes (the range's tensor inputs, else the op's, else its facts' input
elements times the dtype's size; a barrier moves 0), and its facts
(``session.collective_facts``: process group, sequence number, element counts,
dtype, call site), on the op, the range, or a ``record_param_comms`` inside the op.

Example::

    >>> collective_kind("c10d::allreduce_"), collective_kind("gloo:all_reduce")
    ('allreduce', 'allreduce')
    >>> collective_kind("ncclDevKernel_ReduceScatter_RING_LL"), collective_kind("aten::mm")
    ('reduce_scatter', None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from opscope.model.collective_facts import CollectiveFacts, user_call_site
from opscope.model.events import EventTable
from opscope.model.records import FLAG_PYTHON_FUNCTION, SCOPE_USER, RecordedInputs
from opscope.model.session import ProfileSession
from opscope.model.torch_names import (C10D_PREFIX, COLLECTIVE_KINDS, COLLECTIVE_RANGE_PREFIXES,
                                       NCCL_KERNEL_PREFIXES)

# torch's "Input type" spellings -> bytes per element
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4, "long int": 8,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1, "long long": 8, "unsigned short": 2, "unsigned int": 4,
}
_STRIPPED = ("_", "base", "coalesced", "intotensor")


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as one rank issued it; times are aligned Unix ns."""

    kind: str
    nbytes: Optional[int]  # None: not recorded (no record_shapes)
    arrival_ns: int
    end_ns: int
    duration_ns: int
    call_site: Optional[str] = None  # innermost user frame of the dispatcher op
    # its own facts (model.collective_facts: the flight recorder's, or torch's
    # record_param_comms args): process group, sequence number in it, elements, dtype
    pg: Optional[str] = None
    seq: Optional[int] = None
    pg_desc: Optional[str] = None
    in_nelems: Optional[int] = None
    out_nelems: Optional[int] = None
    dtype: Optional[str] = None


def collective_kind(name: str) -> Optional[str]:
    """The normalised kind of a collective event name, or None for any other event.

    >>> collective_kind("c10d::_reduce_scatter_base_"), collective_kind("nccl:all_gather")
    ('reduce_scatter', 'allgather')
    """
    if name.startswith(C10D_PREFIX):
        body = name[len(C10D_PREFIX):]
    elif name.startswith(COLLECTIVE_RANGE_PREFIXES):
        body = name.partition(":")[2]
    elif name.startswith(NCCL_KERNEL_PREFIXES):
        body = name.split("_")[1] if name.count("_") else ""
    else:
        return None
    key = body.lower()
    for part in _STRIPPED:
        key = key.replace(part, "")
    return COLLECTIVE_KINDS.get(key)


def input_bytes(inputs: Optional[RecordedInputs]) -> Optional[int]:
    """Bytes of the tensor inputs whose shape and dtype were recorded, or None.

    >>> from opscope.model.records import RecordedInputs
    >>> input_bytes(RecordedInputs([[4160]], ["float"], [[1]], [""]))
    16640
    """
    if inputs is None:
        return None
    total, known = 0, False
    for shape, dtype in zip(inputs.shapes, inputs.types):
        size = DTYPE_BYTES.get(dtype)
        if size is None or not isinstance(shape, list):  # [] is a 0-dim tensor
            continue
        count = 1
        for dim in shape:
            count *= dim if isinstance(dim, int) else 0
        total, known = total + count * size, True
    return total if known else None


def _rows_by_kind(table: EventTable, worker: bool) -> Dict[str, np.ndarray]:
    """Per kind, the rows of dispatcher ops (``worker`` False) or backend ranges, by start."""
    kinds: Dict[int, str] = {}
    for sid, name in enumerate(table.symbols.names):
        is_range = name.startswith(COLLECTIVE_RANGE_PREFIXES)
        if is_range == worker and (worker or name.startswith(C10D_PREFIX)):
            kind = collective_kind(name)
            if kind is not None:
                kinds[sid] = kind
    if not kinds:
        return {}
    ids = np.fromiter(kinds, dtype=np.int64, count=len(kinds))
    rows = np.flatnonzero(np.isin(table.name_id, ids)
                          & ((table.flags & FLAG_PYTHON_FUNCTION) == 0))
    if worker:
        rows = rows[table.scope[rows] == SCOPE_USER] if len(rows) else rows
    out: Dict[str, List[int]] = {}
    for row, sid in zip(rows.tolist(), table.name_id[rows].tolist()):
        out.setdefault(kinds[sid], []).append(row)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def collective_op_rows(table: EventTable) -> Dict[str, np.ndarray]:
    """Per kind, the rows of the dispatcher's collective ops (``c10d::allreduce_``), by start."""
    return _rows_by_kind(table, False)


def _pair(op_starts: np.ndarray, range_starts: np.ndarray) -> np.ndarray:
    """For each op, the index of its range (-1: none): first unpaired range at or after it."""
    paired = np.full(len(op_starts), -1, dtype=np.int64)
    if len(op_starts) == len(range_starts) and bool((range_starts >= op_starts).all()):
        return np.arange(len(op_starts), dtype=np.int64)
    j = 0
    for i, start in enumerate(op_starts.tolist()):
        while j < len(range_starts) and range_starts[j] < start:
            j += 1
        if j < len(range_starts):
            paired[i] = j
            j += 1
    return paired


def _facts_of_calls(session: ProfileSession) -> Dict[int, CollectiveFacts]:
    """Row of a dispatcher op or backend range -> its facts: its own, else those of the
    first ``record_param_comms`` (torch's NCCL traces) nested in it."""
    table = session.table
    out: Dict[int, CollectiveFacts] = {}
    for row in sorted(session.collective_facts):
        r = row
        while r >= 0 and collective_kind(table.name(r)) is None:
            r = int(table.parent[r])
        if r >= 0:
            out.setdefault(r, session.collective_facts[row])
    return out


def _call(kind: str, nbytes: Optional[int], arrival: int, end: int, duration: int,
          site: Optional[str], facts: Optional[CollectiveFacts]) -> CollectiveCall:
    if facts is None:
        return CollectiveCall(kind, nbytes, arrival, end, duration, site)
    return CollectiveCall(kind, facts.nbytes if nbytes is None else nbytes, arrival, end,
                          duration, site or facts.call_site, facts.pg, facts.seq,
                          facts.pg_desc, facts.in_nelems, facts.out_nelems, facts.dtype)


def collective_calls(session: ProfileSession, offset_ns: int = 0) -> List[CollectiveCall]:
    """The collectives of ``session`` in order of arrival; ``offset_ns`` aligns its clock.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> collective_calls(ProfileSession(EventTable.from_raw(RawSession.empty())))
    []
    """
    table = session.table
    shift = session.epoch_offset_ns + offset_ns
    sig, decoded = table.input_signatures()
    ops, ranges = _rows_by_kind(table, False), _rows_by_kind(table, True)
    facts = _facts_of_calls(session)
    calls: List[CollectiveCall] = []

    def nbytes(kind: str, row: int) -> Optional[int]:
        if kind == "barrier":
            return 0
        return input_bytes(decoded[sig[row]]) if row >= 0 and sig[row] >= 0 else None

    for kind in sorted(set(ops) | set(ranges)):
        op_rows = ops.get(kind, np.zeros(0, dtype=np.int64))
        range_rows = ranges.get(kind, np.zeros(0, dtype=np.int64))
        pair = _pair(table.start_ns[op_rows], table.start_ns[range_rows])
        used = set(pair.tolist())
        for op, r in zip(op_rows.tolist(), pair.tolist()):
            span = int(range_rows[r]) if r >= 0 else op
            size = nbytes(kind, span)
            calls.append(_call(
                kind, size if size is not None or r < 0 else nbytes(kind, op),
                int(table.start_ns[op]) + shift,
                max(int(table.end_ns[op]), int(table.end_ns[span])) + shift,
                int(table.end_ns[span] - table.start_ns[span]),
                user_call_site(session.stacks[op]) if session.stacks else None,
                facts.get(op, facts.get(span))))
        for r, row in enumerate(range_rows.tolist()):
            if r not in used:
                calls.append(_call(
                    kind, nbytes(kind, row), int(table.start_ns[row]) + shift,
                    int(table.end_ns[row]) + shift,
                    int(table.end_ns[row] - table.start_ns[row]), None, facts.get(row)))
    calls.sort(key=lambda c: c.arrival_ns)
    return calls
