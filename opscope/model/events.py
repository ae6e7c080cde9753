"""The columnar event model: one numpy array a field, names interned.

An :class:`EventTable` holds the op and range events of one session, sorted
by ``(start, -end)`` as torch.profiler sorts ``events()``. Tree columns
(``parent``, ``self_ns``) are filled by ``opscope.analysis.tree``.

Example::

    >>> from opscope.model.records import RawSession
    >>> table = EventTable.from_raw(RawSession.empty())
    >>> len(table)
    0
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from opscope.model.arrays import distinct
from opscope.model.records import (FLAG_ASYNC, NO_INPUTS, NO_STACK, RawSession,
                                    RecordedInputs, decode_inputs)


def sort_order(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Indices that sort events by (start, -end), as torch orders events().

    Collectors write each thread's records in start order, so a stable sort
    by start is near-linear; only equal starts need the slower two-key sort.

    >>> sort_order(np.array([5, 1, 1]), np.array([6, 2, 9])).tolist()
    [2, 1, 0]
    """
    if len(start) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s = start[order]
    if np.any(s[1:] == s[:-1]):
        return np.lexsort((-end, start))
    return order


def hash_weights(n: int) -> np.ndarray:
    """``n`` odd pseudo-random 64-bit multipliers, the same on every call (splitmix64)."""
    with np.errstate(over="ignore"):
        z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31)) | np.uint64(1)


def distinct_segments(blob: np.ndarray, offsets: np.ndarray
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group byte-identical segments of ``blob`` without a Python loop per segment.

    ``offsets`` are word offsets into ``blob``; each segment runs from its
    offset to the next larger offset (or the end). Returns (group per offset,
    first word of each group's first segment, its end), groups numbered in
    order of first appearance. Segments are grouped by a 64-bit hash, then
    every segment is compared word for word with its group's first one; if
    any differs (a hash collision), the grouping is redone exactly with a dict.

    >>> blob = np.array([7, 1, 2, 7, 1, 2, 9], dtype=np.int64)
    >>> group, first, end = distinct_segments(blob, np.array([0, 3, 0, 6]))
    >>> group.tolist(), first.tolist(), end.tolist()
    ([0, 0, 0, 1], [0, 6], [3, 7])
    """
    step = np.diff(offsets)
    in_order = bool((step >= 0).all())  # the usual case: offsets in recording order
    if in_order:
        bounds = offsets[np.concatenate(([True], step > 0))]
    else:
        bounds = distinct(offsets)
    seg_end = np.append(bounds[1:], len(blob))
    lengths = seg_end - bounds
    # segment of each offset (offsets all distinct and in order: the identity)
    seg_of = (np.arange(len(offsets)) if len(bounds) == len(offsets) and in_order
              else np.searchsorted(bounds, offsets))
    words = blob[bounds[0]:].view(np.uint64)
    starts = bounds - bounds[0]
    within = np.arange(len(words)) - np.repeat(starts, lengths)
    weights = hash_weights(max(int(lengths.max()), 1))
    hashed = np.zeros(len(bounds), dtype=np.uint64)
    filled = lengths > 0  # only the last segment can be empty
    with np.errstate(over="ignore"):
        if filled.any():
            hashed[filled] = np.add.reduceat(words * weights[within], starts[filled])
        hashed = hashed * np.uint64(0x9E3779B97F4A7C15) + lengths.astype(np.uint64)
    _, first_seg, seg_group = np.unique(hashed, return_index=True, return_inverse=True)
    # renumber groups by first appearance among the offsets
    if in_order:  # segments appear in offset order: the first segment decides
        order = np.argsort(first_seg)
    else:
        first_offset = np.full(len(first_seg), len(offsets), dtype=np.int64)
        np.minimum.at(first_offset, seg_group[seg_of], np.arange(len(offsets)))
        order = np.argsort(first_offset, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    rep = first_seg[order]  # representative segment per (renumbered) group
    seg_group = rank[seg_group]
    # exact check: every segment equals its representative, word for word
    rep_of = rep[seg_group]
    same = np.array_equal(lengths, lengths[rep_of]) and np.array_equal(
        words, words[np.repeat(starts[rep_of], lengths) + within])
    if not same:
        return _distinct_segments_exact(blob, bounds, seg_end, seg_of)
    return seg_group[seg_of], bounds[rep], seg_end[rep]


def _distinct_segments_exact(blob, bounds, seg_end, seg_of):
    """``distinct_segments`` by bytes in a dict: the fallback after a hash collision."""
    raw = blob.tobytes()
    ids: Dict[bytes, int] = {}
    group = np.empty(len(seg_of), dtype=np.int64)
    firsts: List[int] = []
    for i, s in enumerate(seg_of.tolist()):
        key = raw[int(bounds[s]) * 8:int(seg_end[s]) * 8]
        g = ids.get(key)
        if g is None:
            g = ids[key] = len(firsts)
            firsts.append(s)
        group[i] = g
    firsts_arr = np.array(firsts, dtype=np.int64)
    return group, bounds[firsts_arr], seg_end[firsts_arr]


class SymbolTable:
    """Strings interned to dense integer ids.

    >>> s = SymbolTable(["aten::add"])
    >>> s.intern("aten::mul"), s[0]
    (1, 'aten::add')
    """

    def __init__(self, names: Iterable[str] = ()):
        self.names: List[str] = list(names)
        self._ids: Dict[str, int] = {n: i for i, n in enumerate(self.names)}

    def intern(self, name: str) -> int:
        sid = self._ids.get(name)
        if sid is None:
            sid = len(self.names)
            self.names.append(name)
            self._ids[name] = sid
        return sid

    def id_of(self, name: str) -> Optional[int]:
        return self._ids.get(name)

    def __getitem__(self, sid: int) -> str:
        return self.names[sid]

    def __len__(self) -> int:
        return len(self.names)


class EventTable:
    """Events of one session as parallel numpy columns.

    Times are ns on the collector clock; ``base_ns`` is the session start, so
    ``(start_ns - base_ns) / 1000`` is torch's relative ``time_range.start``.
    ``record`` is the index in ``raw.records`` a row came from (-1: a row the
    analysis added, such as a ``[memory]`` event), so per-record data of a
    source (stacks, FLOPs of a saved trace) reaches its row without guessing.
    """

    COLUMNS = (
        "name_id", "start_ns", "end_ns", "thread_index", "rf_thread_id",
        "fwd_thread_id", "seq_nr", "scope", "flags", "input_offset", "stack_id", "record",
    )

    def __init__(self, symbols: SymbolTable, columns: Dict[str, np.ndarray], *,
                 raw: Optional[RawSession] = None, base_ns: int = 0,
                 epoch_offset_ns: int = 0, thread_ids: Optional[List[int]] = None):
        self.symbols = symbols
        for name in self.COLUMNS:
            setattr(self, name, columns[name])
        self.raw = raw
        self.base_ns = base_ns
        self.epoch_offset_ns = epoch_offset_ns
        self.thread_ids = np.asarray(thread_ids if thread_ids is not None else [], dtype=np.int64)
        self._signatures: Optional[Tuple[np.ndarray, List[RecordedInputs]]] = None
        # made when first read: build_tree sets both, and a fresh column costs page faults
        self._parent: Optional[np.ndarray] = None
        self._self_ns: Optional[np.ndarray] = None

    @property
    def parent(self) -> np.ndarray:
        """Parent row of each event (-1: a root), as ``analysis.tree.build_tree`` sets it."""
        if self._parent is None:
            self._parent = np.full(len(self), -1, dtype=np.int64)
        return self._parent

    @parent.setter
    def parent(self, value: np.ndarray) -> None:
        self._parent = value

    @property
    def self_ns(self) -> np.ndarray:
        """Self time of each event (its duration until ``build_tree`` sets it)."""
        if self._self_ns is None:
            self._self_ns = self.end_ns - self.start_ns
        return self._self_ns

    @self_ns.setter
    def self_ns(self, value: np.ndarray) -> None:
        self._self_ns = value

    @classmethod
    def from_raw(cls, raw: RawSession) -> "EventTable":
        rec = raw.records
        start = rec["start_ns"]
        if len(start) < 2 or bool((start[1:] > start[:-1]).all()):
            order = None  # one thread's records come in start order: no gather
        else:
            order = sort_order(start, rec["end_ns"])

        def column(values: np.ndarray, dtype=None) -> np.ndarray:
            values = values if order is None else values[order]
            return np.ascontiguousarray(values, dtype=dtype)

        own = ("stack_id", "record")
        columns = {name: column(rec[name]) for name in cls.COLUMNS if name not in own}
        index = np.int32 if len(rec) < 1 << 31 else np.int64  # 4 bytes a row where they do
        columns["record"] = (np.arange(len(rec), dtype=index) if order is None
                             else order.astype(index))
        if raw.stack_ids is not None and len(raw.stack_ids) == len(rec):
            columns["stack_id"] = column(np.asarray(raw.stack_ids), np.int32)
        else:
            columns["stack_id"] = np.full(len(rec), NO_STACK, dtype=np.int32)
        return cls(SymbolTable(raw.names), columns, raw=raw, base_ns=raw.start_ns,
                   epoch_offset_ns=raw.epoch_offset_ns, thread_ids=raw.thread_ids)

    def __len__(self) -> int:
        return len(self.name_id)

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    @property
    def os_tid(self) -> np.ndarray:
        """OS thread id of each event (what the Chrome trace calls ``tid``)."""
        if len(self.thread_ids) == 0:
            return np.zeros(len(self), dtype=np.int64)
        return self.thread_ids[self.thread_index]

    @property
    def is_async(self) -> np.ndarray:
        return (self.flags & FLAG_ASYNC) != 0

    def name(self, i: int) -> str:
        return self.symbols[int(self.name_id[i])]

    def named_like(self, prefix: str) -> np.ndarray:
        """Per event: True where its name starts with ``prefix`` (``ProfilerStep#``...)."""
        ids = [i for i, n in enumerate(self.symbols.names) if n.startswith(prefix)]
        if not ids:
            return np.zeros(len(self), dtype=bool)
        return np.isin(self.name_id, ids)

    def inputs(self, i: int) -> Optional[RecordedInputs]:
        """Recorded inputs of event ``i`` (None without ``record_shapes``)."""
        off = int(self.input_offset[i])
        if self.raw is None or off == NO_INPUTS:
            return None
        return self.raw.inputs_of(int(self.thread_index[i]), off)

    def input_signatures(self) -> Tuple[np.ndarray, List[RecordedInputs]]:
        """Distinct recorded inputs: an id per event (-1: none) and each id's decoding.

        Events whose encoded inputs are byte-identical share an id, so each
        distinct signature is decoded (and rendered by exporters) once.
        """
        if self._signatures is not None:
            return self._signatures
        sig = np.full(len(self), -1, dtype=np.int64)
        decoded: List[RecordedInputs] = []
        has = np.flatnonzero(self.input_offset != NO_INPUTS) if self.raw is not None else []
        if len(has):
            ids: Dict[bytes, int] = {}
            threads = self.thread_index[has]
            offsets = self.input_offset[has].astype(np.int64)
            for t in distinct(threads).tolist():
                mine = threads == t
                blob = self.raw.inputs[t] if t < len(self.raw.inputs) else np.zeros(0, np.int64)
                group, firsts, ends = distinct_segments(blob, offsets[mine])
                # groups are distinct within the thread; merge equal ones across threads
                global_id = np.empty(len(firsts), dtype=np.int64)
                raw_bytes = blob.tobytes()
                for g, (a, b) in enumerate(zip(firsts.tolist(), ends.tolist())):
                    key = raw_bytes[a * 8:b * 8]
                    k = ids.get(key)
                    if k is None:
                        k = ids[key] = len(decoded)
                        decoded.append(decode_inputs(blob, a, b))
                    global_id[g] = k
                sig[has[mine]] = global_id[group]
        self._signatures = (sig, decoded)
        return self._signatures

    def take(self, keep: np.ndarray) -> "EventTable":
        """A new table with only the events where ``keep`` is true (parents remapped)."""
        idx = np.flatnonzero(keep)
        columns = {name: getattr(self, name)[idx] for name in self.COLUMNS}
        out = EventTable(self.symbols, columns, raw=self.raw, base_ns=self.base_ns,
                         epoch_offset_ns=self.epoch_offset_ns, thread_ids=list(self.thread_ids))
        remap = np.full(len(self) + 1, -1, dtype=np.int64)
        remap[idx] = np.arange(len(idx))
        out.parent = remap[self.parent[idx]]  # parent -1 maps through remap[-1] == -1
        out.self_ns = self.self_ns[idx]
        return out
