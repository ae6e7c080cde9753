"""Write a session as a Chrome trace in torch.profiler 2.13's schema.

The file opens in chrome://tracing, Perfetto, TensorBoard's profiler plugin
and Holistic Trace Analysis. Layout, as torch (Kineto) writes it::

    {"schemaVersion": 1, "deviceProperties": [], <option flags>, <user metadata>,
     "trace_id": ..., "displayTimeUnit": "ms", "baseTimeNanoseconds": B,
     "traceEvents": [<M process/thread names>, <X per op or range>,
                     <s/f fwdbwd flows>, <X Trace span>, <i markers>],
     "traceName": <path>}

``ts`` is microseconds since ``baseTimeNanoseconds`` on the Unix clock, with
nanosecond precision (three decimals). Events are streamed one line each;
every string goes through ``json.dumps`` so any name round-trips.
``chrome_trace_to(session, out, path)`` writes to an open binary stream (the
format registry, ``opscope.outputs``, opens it); ``write_chrome_trace(session,
path)`` opens ``path`` itself.

Example::

    >>> import json, os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
    >>> _ = write_chrome_trace(build_session(RawSession.empty()), path)
    >>> doc = json.load(open(path))
    >>> doc["schemaVersion"], doc["displayTimeUnit"], doc["traceName"] == path
    (1, 'ms', True)
    >>> [e["name"] for e in doc["traceEvents"]][:3]
    ['process_name', 'process_labels', 'process_sort_index']
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO, List, Optional, Tuple

import numpy as np

from opscope.analysis.aggregate import grouped
from opscope.analysis.facts import forward_links
from opscope.export.json_rows import JsonRows, StringTable
from opscope.export.trace_header import trace_header, trace_window
from opscope.analysis.device import session_correlations
from opscope.export.units import micros_text as _us
from opscope.export.device_trace import (row_categories, write_device_events,
                                         write_device_processes)
from opscope.export.trace_args import extra_args
from opscope.files import PathLike, output_file
from opscope.model.records import FLAG_MEMORY, SCOPE_USER
from opscope.model.session import ProfileSession
from opscope.model.torch_names import MEMORY_EVENT

def forward_backward_links(session: ProfileSession) -> List[Tuple[int, int]]:
    """(forward row, backward row) pairs for ``fwdbwd`` flows, backward time order.

    The pairs of ``opscope.analysis.facts.forward_links``: each backward node
    with the forward op that created it.
    """
    return [tuple(pair) for pair in _link_rows(session).tolist()]


def _link_rows(session: ProfileSession) -> np.ndarray:
    """``forward_backward_links`` as a (links, 2) array."""
    fwd = forward_links(session)
    bwd = np.flatnonzero(fwd >= 0)
    return np.stack([fwd[bwd], bwd], axis=1)


class _ChunkWriter:
    """Writes rendered event lines, putting ``,\\n`` between non-empty chunks."""

    def __init__(self, stream):
        self.stream = stream
        self.started = False

    def add(self, data) -> None:
        """Write ``data`` (bytes-like), after a separator unless it is the first."""
        if len(data):
            if self.started:
                self.stream.write(b",\n")
            self.stream.write(data)
            self.started = True

    def line(self, text: str) -> None:
        """Write one rendered line of text."""
        self.add(text.encode())

    def rows(self, lines: JsonRows) -> None:
        """Write every row of ``lines``, rendered a chunk at a time."""
        for data in lines.chunks(",\n"):
            self.add(data)


def write_chrome_trace(session: ProfileSession, path: PathLike) -> str:
    """Write ``session`` as a Chrome trace JSON file (gzip when ``path`` ends in .gz).

    The write is atomic; metadata that is not valid JSON raises ``ValueError``
    naming its key and leaves ``path`` as it was. Returns the path as a string.
    A bad ``path`` (``''``, not a path, a folder, no such folder) fails at the
    call; a write error is an ``OSError`` naming ``path``.

    >>> import gzip, json, os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json.gz")
    >>> _ = write_chrome_trace(build_session(RawSession.empty()), path)
    >>> "traceEvents" in json.load(gzip.open(path, "rt"))
    True
    """
    destination = output_file(path, "export_chrome_trace")
    with destination.open(binary=True) as out:
        return chrome_trace_to(session, out, destination.path)


def chrome_trace_to(session: ProfileSession, out: BinaryIO, path: str) -> str:
    """Write ``session``'s Chrome trace to the binary stream ``out``; ``path`` is its
    ``traceName`` (and is returned)."""
    header = trace_header(session)
    out.write(b"{\n")
    for key, value in header.items():
        out.write(f"  {json.dumps(key)}: {json.dumps(value, allow_nan=False)},\n".encode())
    out.write(b'  "traceEvents": [\n')
    _write_events(session, header["baseTimeNanoseconds"], _ChunkWriter(out))
    out.write(f'\n  ],\n  "traceName": {json.dumps(path)}\n}}\n'.encode())
    return path


def _write_events(session: ProfileSession, base_ns: int, out: _ChunkWriter) -> None:
    table = session.table
    pid = int(session.process_id)
    # collector ns -> ns since base, in exact integers
    shift = session.epoch_offset_ns - base_ns
    win_start, win_stop = trace_window(session)
    start_us = _us(win_start + shift)

    meta = '{"ph": "M", "name": "%s", "ts": %s, "pid": %d, "tid": %d, "args": {"%s": %s}}'
    out.line(meta % ("process_name", start_us, pid, 0, "name", '"python"'))
    out.line(meta % ("process_labels", start_us, pid, 0, "labels", '"CPU"'))
    out.line(meta % ("process_sort_index", start_us, pid, 0, "sort_index", pid))
    if len(table):
        tids = table.os_tid  # each thread's first row starts a run of its rows: no sort
        runs = np.flatnonzero(np.concatenate(([True], tids[1:] != tids[:-1])))
        uniq, first_run = np.unique(tids[runs], return_index=True)
        names = session.thread_names  # Python's own names ("MainThread") where known
        for tid in uniq[np.argsort(first_run)].tolist():
            out.line(meta % ("thread_name", start_us, pid, tid, "name",
                             json.dumps(names.get(tid) or f"thread {tid} (python)")))
            out.line(meta % ("thread_sort_index", start_us, pid, tid, "sort_index", tid))

    write_device_processes(session, start_us, out.line)
    _write_ops(session, pid, shift, out)
    _write_marks(session, pid, shift, out)
    _write_flows(session, pid, shift, out)
    write_device_events(session, pid, shift, out.line)
    if session.memory is not None:
        _write_memory(session, pid, shift, out)

    out.line('{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", '
             '"tid": "PyTorch Profiler", "ts": %s, "dur": %s, "args": {"Op count": 0}}'
             % (start_us, _us(win_stop - win_start)))
    out.line('{"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", '
             '"pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": %s}' % start_us)
    out.line('{"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", '
             '"ts": %s}' % _us(win_stop + shift))


OPS_BATCH = 1 << 18  # rows laid out per JsonRows: the writer's temporaries are this size


def _write_ops(session: ProfileSession, pid: int, shift: int, out: _ChunkWriter) -> None:
    """One ``X`` line per table row but memory rows (written as instants), ``OPS_BATCH``
    rows at a time so that memory stays bounded; the lines do not depend on the batches."""
    table = session.table
    extra = extra_args(session)
    correlation = session_correlations(session)
    for lo in range(0, len(table), OPS_BATCH):
        hi = min(len(table), lo + OPS_BATCH)
        memory = (table.flags[lo:hi] & FLAG_MEMORY) != 0
        # a batch without memory rows is a slice: its columns are views, not copies
        rows = np.flatnonzero(~memory) + lo if memory.any() else slice(lo, hi)
        if not isinstance(rows, slice) and not len(rows):
            continue
        out.rows(_op_lines(session, pid, shift, rows, extra, correlation))


def _op_lines(session: ProfileSession, pid: int, shift: int, rows, extra: List[Any],
              correlation: Optional[np.ndarray]) -> JsonRows:
    """The ``X`` lines of ``rows`` (a slice or row numbers): names, threads and extra
    args rendered once per distinct value and picked per row, the numbers by
    ``JsonRows`` in bulk."""
    table = session.table
    numbers = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
    # '"cat": ..., "name": ..., "pid": P, "tid": T' per distinct (range?, name, thread)
    tid_of = np.asarray(table.thread_ids, dtype=np.int64)
    thread = table.thread_index[rows].astype(np.int64)
    key = ((table.name_id[rows].astype(np.int64) * 2 + (table.scope[rows] == SCOPE_USER))
           * max(len(tid_of), 1) + thread)
    groups = grouped(key)  # one head per distinct key, rendered from its first row
    head_index, first = groups.of_event, groups.first
    tids = tid_of[thread[first]] if len(tid_of) else np.zeros(len(first), np.int64)
    heads = StringTable([  # rendered from one row of each distinct key
        '"cat": "%s", "name": %s, "pid": %d, "tid": %d' % (cat, json.dumps(table.name(r)), pid, tid)
        for cat, r, tid in zip(row_categories(table, numbers[first]),
                               numbers[first].tolist(), tids.tolist())])
    dur_ns = np.maximum(table.end_ns[rows] - table.start_ns[rows], 0)
    seq, fwd = table.seq_nr[rows], table.fwd_thread_id[rows]
    lines = JsonRows(len(numbers))
    lines.text('{"ph": "X", ')
    lines.choice(heads, head_index)
    lines.text(', "ts": ')
    lines.number(table.start_ns[rows] + shift, micros=True)
    lines.text(', "dur": ')
    lines.number(dur_ns, micros=True)
    lines.text(', "args": {"External id": ')
    lines.number(numbers + 1)
    lines.text(", ")
    has_seq = seq >= 0
    lines.text('"Sequence number": ', has_seq)
    lines.number(seq, present=has_seq)
    lines.text(', "Fwd thread id": ', has_seq)
    lines.number(fwd, present=has_seq)
    lines.text(", ", has_seq)
    lines.text('"Record function id": 0, ')
    if correlation is not None:  # CUDA API calls: the id their device work carries
        has_corr = correlation[rows] > 0
        lines.text('"correlation": ', has_corr)
        lines.number(correlation[rows], present=has_corr)
        lines.text(", ", has_corr)
    for part in extra:
        if isinstance(part, tuple):
            lines.choice(part[0], part[1][rows])
        else:
            has_flops = part[rows] > 0
            lines.text('"flops": ', has_flops)
            lines.number(part[rows], present=has_flops)
            lines.text(", ", has_flops)
    lines.text('"Ev Idx": ')
    lines.number(numbers)
    lines.text("}}")
    return lines


def _write_flows(session: ProfileSession, pid: int, shift: int, out: _ChunkWriter) -> None:
    """An ``s``/``f`` pair of ``fwdbwd`` flow events per forward/backward link."""
    links = _link_rows(session)
    if len(links) == 0:
        return
    rows = links.ravel()  # s1, f1, s2, f2, ...
    is_end = np.arange(len(rows)) % 2 == 1
    phase = StringTable(['"s"', '"f"'])
    tids = session.table.os_tid
    lines = JsonRows(len(rows))
    lines.text('{"ph": ')
    lines.choice(phase, is_end.astype(np.intp))
    lines.text(', "id": ')
    lines.number(np.arange(len(rows)) // 2 + 1)
    lines.text(', "pid": %d, "tid": ' % pid)
    lines.number(tids[rows])
    lines.text(', "ts": ')
    lines.number(session.table.start_ns[rows] + shift, micros=True)
    lines.text(', "cat": "fwdbwd", "name": "fwdbwd"')
    lines.text(', "bp": "e"', is_end)
    lines.text("}")
    out.rows(lines)


def _write_memory(session: ProfileSession, pid: int, shift: int, out: _ChunkWriter) -> None:
    """One ``MEMORY_EVENT`` instant event per allocator record, with torch's args."""
    mem = session.memory
    table = session.table
    n = len(mem)
    if n == 0:
        return
    tid_of = np.append(np.asarray(table.thread_ids, dtype=np.int64), 0)
    thread = mem["thread_index"].astype(np.int64)
    tids = tid_of[np.where((thread >= 0) & (thread < len(tid_of) - 1), thread, -1)]
    ts_ns = mem["time_ns"] + shift
    first_idx = len(table)
    lines = JsonRows(n)
    lines.text('{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": %s, '
               '"pid": %d, "tid": ' % (json.dumps(MEMORY_EVENT), pid))
    lines.number(tids)
    lines.text(', "ts": ')
    lines.number(ts_ns, micros=True)
    lines.text(', "args": {')
    for label, column in (("Total Reserved", "total_reserved"),
                          ("Total Allocated", "total_allocated"), ("Bytes", "bytes"),
                          ("Device Id", "device_index"), ("Device Type", "device_type"),
                          ("Addr", "addr")):
        lines.text('"%s": ' % label)
        lines.number(mem[column])
        lines.text(", ")
    lines.text('"finished": false, "Ev Idx": ')
    lines.number(np.arange(first_idx, first_idx + n))
    lines.text("}}")
    out.rows(lines)


def _write_marks(session: ProfileSession, pid: int, shift: int, out: _ChunkWriter) -> None:
    """One thread-scoped instant event (``"ph": "i", "s": "t"``) per ``opscope.itt.mark``.

    ``cpu_instant_event`` is the category Kineto gives CPU instant events.
    """
    for ns, tid, name in session.marks:
        out.line('{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": %s, "pid": %d, '
                 '"tid": %d, "ts": %s}' % (json.dumps(name), pid, tid, _us(ns + shift)))
