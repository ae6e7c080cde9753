"""A trace's plain op events read by the C scanner (trace_scan.cpp), the rest as before.

Most of a large trace is ops of one shape: ``ph``, ``cat``, ``name``, ``pid``,
``tid``, ``ts``, ``dur`` and args that carry only ``External id``, ``Sequence
number``, ``Fwd thread id``, ``Record function id`` and ``Ev Idx``. Parsing each into
a dict and reading it back costs about ten microseconds an event in Python; the
scanner reads those fields into rows of numbers in C. ``ScanFeed.batch`` takes the
text of one batch (``trace_stream``), scans it, puts runs of plain ops straight into
the ``TraceColumns`` (``add_plain``), and parses every other event (memory,
metadata, an op with shapes, a stack or an odd value) with json, in order, into
``TraceColumns.add``, as the whole batch was before. So the columns are the same
either way (tests/test_trace_fast.py reads traces both ways).

The scanner is built once like the observer (``analysis.trace_reading``, which
passes it in); without it every batch is parsed by json. A batch the scanner does
not take (not JSON as it reads it), or that is mostly not plain ops (a trace
recorded with shapes), is parsed by json whole.

Example::

    >>> rows = np.zeros(3, dtype=ROW_DTYPE)
    >>> rows["plain"] = [1, 0, 1]
    >>> runs(rows["plain"].astype(bool))
    [(0, 1, True), (1, 2, False), (2, 3, True)]
"""

from __future__ import annotations

import json
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from opscope.load.trace_columns import NO_TEXT, TraceColumns
from opscope.load.trace_scan import MAX_MICROSECONDS, is_op_category

# the scanner's Row (trace_scan.cpp), as numpy reads it
ROW_DTYPE = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("pid", "<i8"), ("tid", "<i8"),
                      ("seq", "<i8"), ("fwd", "<i8"), ("start", "<i8"), ("end", "<i8"),
                      ("ph", "<i4"), ("cat", "<i4"), ("name", "<i4"), ("plain", "u1"),
                      ("pad", "u1", (3,))])
MOST_RUNS = 64  # events per run, at least, for a batch to be read in runs


def runs(mask: np.ndarray) -> List[Tuple[int, int, bool]]:
    """(start, end, value) of each run of equal values of the bool array ``mask``."""
    if not len(mask):
        return []
    edges = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    starts = [0] + edges.tolist()
    ends = edges.tolist() + [len(mask)]
    return [(a, b, bool(mask[a])) for a, b in zip(starts, ends)]


class ScanFeed:
    """Hands a trace's batches to ``cols``: plain ops from the scanner, the rest parsed.

    ``loads`` parses one event's text (the loader's fast ``loads``, json's after it).
    """

    def __init__(self, scanner: Any, cols: TraceColumns, loads: Callable[[bytes], Any]):
        self.scanner, self.cols, self.loads = scanner, cols, loads
        self.handle = scanner.new()
        self.strings: List[str] = []  # the scanner's string ids
        self.maps = {key: np.full(0, -1, dtype=np.int64) for key in ("name", "cat")}
        self.op_cats = np.zeros(0, dtype=bool)  # per string id: an op's category
        self.x_id = -1  # the id of "X"

    def close(self) -> None:
        self.scanner.free(self.handle)

    def reset(self) -> None:
        """A second ``traceEvents`` key: the columns start again (their ids too)."""
        self.cols.reset()
        for key in self.maps:
            self.maps[key][:] = -1

    def batch(self, text: str, first: int) -> Optional[Tuple[int, bool]]:
        """Read the events of ``text`` (``traceEvents`` items from place ``first``, with
        their commas); (events, whether one has a ``ph``), or None: parse it whole."""
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: json's to read
            return None
        scanned = self.scanner.scan(self.handle, data)
        if scanned is None:
            return None
        rows = np.frombuffer(scanned[0], dtype=ROW_DTYPE)
        self._learn(scanned[1])
        plain = self._plain(rows)
        parts = runs(plain)
        if len(parts) > 2 + len(rows) // MOST_RUNS or 2 * plain.sum() < len(rows):
            return None  # mostly not plain ops: one json parse of the batch is quicker
        some_event = bool(plain.any())
        for a, b, is_plain in parts:
            if is_plain:
                add_plain(self.cols, rows[a:b], self)
                continue
            events = [self._parse(data[s:e]) for s, e in
                      zip(rows["start"][a:b].tolist(), rows["end"][a:b].tolist())]
            some_event = some_event or any(type(e) is dict and "ph" in e for e in events)
            self.cols.add(events, first + a)
        return len(rows), some_event

    def _parse(self, item: bytes) -> Any:
        try:
            return self.loads(item)
        except ValueError:  # an integer past 64 bits, a lone surrogate: json reads it
            return json.loads(item)

    def _learn(self, fresh: List[str]) -> None:
        if not fresh:
            return
        self.strings += fresh
        n = len(self.strings)
        for key in self.maps:
            grown = np.full(n, -1, dtype=np.int64)
            grown[:len(self.maps[key])] = self.maps[key]
            self.maps[key] = grown
        self.op_cats = np.concatenate([self.op_cats, np.array(
            [is_op_category(s) for s in fresh], dtype=bool)])
        if self.x_id < 0 and "X" in fresh:
            self.x_id = self.strings.index("X")

    def _plain(self, rows: np.ndarray) -> np.ndarray:
        """The rows that are ops read whole by the scanner, with usable times."""
        cat = rows["cat"]
        plain = (rows["plain"] == 1) & (rows["ph"] == self.x_id)
        plain &= self.op_cats[np.where(plain, cat, 0)] if len(self.op_cats) else False
        for what in ("ts", "dur"):
            plain &= np.abs(rows[what]) <= MAX_MICROSECONDS  # NaN fails too
        return plain

    def codes(self, key: str, ids: np.ndarray, table) -> np.ndarray:
        """The ``table`` (``Interned``) ids of the scanner's string ids ``ids``, new
        strings numbered in the order they first occur."""
        known = self.maps[key]
        new = known[ids] < 0
        if new.any():
            fresh, at = np.unique(ids[new], return_index=True)
            for k in fresh[np.argsort(at, kind="stable")].tolist():
                known[k] = table.id(self.strings[k])
        return known[ids].astype(np.int32)


def interned_ints(values: np.ndarray, table) -> np.ndarray:
    """The ``table`` ids of int64 ``values``, new values numbered in first-seen order."""
    distinct, at, inverse = np.unique(values, return_index=True, return_inverse=True)
    ids = np.empty(len(distinct), dtype=np.int64)
    for k in np.argsort(at, kind="stable").tolist():
        ids[k] = table.id(int(distinct[k]))
    return ids[inverse.reshape(-1)].astype(np.int32)


def add_plain(cols: TraceColumns, rows: np.ndarray, feed: ScanFeed) -> None:
    """Put plain ops (scanner rows) into ``cols`` as ``TraceColumns.add`` would: their
    args have no inputs, stack, FLOPs, correlation, module or collective."""
    n = len(rows)
    cols._put("ts", rows["ts"].copy())
    cols._put("dur", rows["dur"].copy())
    cols._put("name", feed.codes("name", rows["name"], cols.names))
    cols._put("tid", interned_ints(rows["tid"], cols.tids))
    cols._put("cat", feed.codes("cat", rows["cat"], cols.cats))
    cols._put("python", np.zeros(n, dtype=bool))
    cols._put("seq", rows["seq"].copy())
    cols._put("fwd", rows["fwd"].copy())
    # one value on every row: views that hold no memory (TraceColumns.column)
    cols._put("corr", np.broadcast_to(np.zeros(1, dtype=np.int64), (n,)))
    cols._put("sig", np.broadcast_to(np.full(1, -1, dtype=np.int32), (n,)))
    cols._put("stack", np.broadcast_to(np.full(1, NO_TEXT, dtype=np.int32), (n,)))
    if "flops" in cols.batches:
        cols._put("flops", np.zeros(n, dtype=np.int64))
        cols._put("has_flops", np.zeros(n, dtype=bool))
    pid = int(rows["pid"][0])
    cols.pids.setdefault(True, pid)
    cols.pids.setdefault(False, pid)
    cols.count += n
