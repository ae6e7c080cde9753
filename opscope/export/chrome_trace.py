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
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.analysis.facts import forward_links, module_ranges
from opscope.analysis.modules import module_hierarchy
from opscope.export.atomic import PathLike, atomic_binary_writer
from opscope.export.json_rows import JsonRows, StringTable
from opscope.export.output_path import check_output_path
from opscope.export.trace_header import trace_header, trace_window
from opscope.analysis.device import session_correlations
from opscope.export.units import micros_text as _us
from opscope.export.device_trace import (row_categories, write_device_events,
                                         write_device_processes)
from opscope.model.modules import TRACE_ARG_FUSED, fused_modules_text
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
    naming its key before anything is written. Returns the path as a string.
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
    path = check_output_path("export_chrome_trace", "path", path)
    header = trace_header(session)
    with atomic_binary_writer(path) as f:
        f.write(b"{\n")
        for key, value in header.items():
            f.write(f"  {json.dumps(key)}: {json.dumps(value, allow_nan=False)},\n".encode())
        f.write(b'  "traceEvents": [\n')
        _write_events(session, header["baseTimeNanoseconds"], _ChunkWriter(f))
        f.write(f'\n  ],\n  "traceName": {json.dumps(path)}\n}}\n'.encode())
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
        uniq, first_row = np.unique(table.os_tid, return_index=True)
        names = session.thread_names  # Python's own names ("MainThread") where known
        for tid in uniq[np.argsort(first_row)].tolist():
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
    extra = _extra_args(session)
    correlation = session_correlations(session)
    for lo in range(0, len(table), OPS_BATCH):
        rows = np.flatnonzero((table.flags[lo:lo + OPS_BATCH] & FLAG_MEMORY) == 0) + lo
        if len(rows):
            out.rows(_op_lines(session, pid, shift, rows, extra, correlation))


def _op_lines(session: ProfileSession, pid: int, shift: int, rows: np.ndarray,
              extra: List[Any], correlation: Optional[np.ndarray]) -> JsonRows:
    """The ``X`` lines of ``rows``: names, threads and extra args rendered once per
    distinct value and picked per row, the numbers by ``JsonRows`` in bulk."""
    table = session.table
    # '"cat": ..., "name": ..., "pid": P, "tid": T' per distinct (range?, name, thread)
    tid_of = np.asarray(table.thread_ids, dtype=np.int64)
    tids = tid_of[table.thread_index[rows]] if len(tid_of) else np.zeros(len(rows), np.int64)
    tid_values, tid_code = np.unique(tids, return_inverse=True)
    key = ((table.name_id[rows].astype(np.int64) * 2 + (table.scope[rows] == SCOPE_USER))
           * len(tid_values) + tid_code)
    _, first, head_index = np.unique(key, return_index=True, return_inverse=True)
    heads = StringTable([  # rendered from one row of each distinct key
        '"cat": "%s", "name": %s, "pid": %d, "tid": %d' % (cat, json.dumps(table.name(r)), pid, tid)
        for cat, r, tid in zip(row_categories(table, rows[first]), rows[first].tolist(),
                               tids[first].tolist())])
    dur_ns = np.maximum(table.end_ns[rows] - table.start_ns[rows], 0)
    seq, fwd = table.seq_nr[rows], table.fwd_thread_id[rows]
    lines = JsonRows(len(rows))
    lines.text('{"ph": "X", ')
    lines.choice(heads, head_index)
    lines.text(', "ts": ')
    lines.number(table.start_ns[rows] + shift, micros=True)
    lines.text(', "dur": ')
    lines.number(dur_ns, micros=True)
    lines.text(', "args": {"External id": ')
    lines.number(rows + 1)
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
    lines.number(rows)
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


def intern_strings(per_row: List[str]) -> Tuple[StringTable, np.ndarray]:
    """Per-row strings as (distinct strings, index per row); '' becomes -1 (nothing).

    >>> table, index = intern_strings(["a", "", "b", "a"])
    >>> len(table), index.tolist()
    (2, [0, -1, 1, 0])
    """
    ids: Dict[str, int] = {"": -1}
    index = np.fromiter((ids.setdefault(text, len(ids) - 1) for text in per_row),
                        dtype=np.intp, count=len(per_row))
    del ids[""]
    return StringTable(list(ids)), index


def _extra_args(session: ProfileSession) -> List[Any]:
    """Args beyond the fixed ones, in write order: each part is (strings, index per
    event), or the FLOP estimate per event (written where it is > 0).

    The parts are the recorded inputs, the module args, a collective's facts
    (``model.collective_facts``), ``flops`` and the ``Call stack``; each distinct
    input signature and stack is rendered once.
    """
    table = session.table
    parts: List[Any] = [_input_args(table)]
    if session.modules is not None or session.fused_modules:
        parts.append(intern_strings(_module_args(session)))
    if session.collective_facts:
        parts.append(_collective_args(session))
    if session.flops is not None:
        parts.append(np.asarray(session.flops, dtype=np.int64))
    if session.stacks is not None:
        rendered: Dict[int, int] = {}
        texts: List[str] = []

        def stack_index(stack) -> int:
            if not stack:
                return -1
            k = rendered.get(id(stack))
            if k is None:  # torch: innermost frame first, each followed by ';'
                k = rendered[id(stack)] = len(texts)
                texts.append('"Call stack": %s, ' % json.dumps(";".join(stack) + ";"))
            return k

        index = np.fromiter((stack_index(st) for st in session.stacks), dtype=np.intp,
                            count=len(session.stacks))
        parts.append((StringTable(texts), index))
    return parts


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


def _module_args(session: ProfileSession) -> List[str]:
    """Per event, its rendered module args ('' when none).

    An op gets ``"Module Hierarchy"`` (``Model.encoder.0``). A module range
    (``with_modules``) is marked by ``"Module Class"``, ``"Module Path"``,
    ``"Module Hierarchy"`` and ``"Module Parameters"`` (see ``opscope.model.modules``).
    A kernel fused from several modules adds ``"Fused Modules"`` (``0.ln (LayerNorm) x10; ..``).
    """
    out = [""] * len(session.table)
    rendered: Dict[str, str] = {}
    for i, text in enumerate(module_hierarchy(session)):
        if text:  # each text rendered once
            out[i] = rendered.get(text) or rendered.setdefault(
                text, '"Module Hierarchy": %s, ' % json.dumps(text))
    ranges = np.flatnonzero(module_ranges(session))
    for name_id in np.unique(session.table.name_id[ranges]).tolist():  # once per module
        text = "".join("%s: %s, " % (json.dumps(k), json.dumps(v)) for k, v in session.modules[
            session.table.symbols.names[name_id]].trace_args().items())
        for i in ranges[session.table.name_id[ranges] == name_id].tolist():
            out[i] = text
    for i, entries in session.fused_modules.items():
        out[i] += "%s: %s, " % (json.dumps(TRACE_ARG_FUSED),
                                json.dumps(fused_modules_text(entries)))
    return out


def _collective_args(session: ProfileSession) -> Tuple[StringTable, np.ndarray]:
    """A collective's facts as torch spells them on ``record_param_comms``
    (``"Process Group Name"``, ``"Seq"``, ``"In msg nelems"``...), on the rows that have them."""
    texts: Dict[str, int] = {}
    index = np.full(len(session.table), -1, dtype=np.intp)
    for row, facts in session.collective_facts.items():
        text = "".join("%s: %s, " % (json.dumps(k), json.dumps(v))
                       for k, v in facts.to_args().items())
        index[row] = texts.setdefault(text, len(texts))
    return StringTable(list(texts)), index


def _input_args(table) -> Tuple[StringTable, np.ndarray]:
    """Rendered input args per distinct signature, and each event's signature (-1: none).

    A record without inputs (a user range) gets none, as torch writes its ranges.
    """
    sig, decoded = table.input_signatures()
    strings: Dict[Tuple[str, ...], str] = {}  # string lists repeat across signatures

    def string_list(values: List[str]) -> str:
        key = tuple(values)
        text = strings.get(key)
        if text is None:
            text = strings[key] = json.dumps(values)
        return text

    # shapes and strides are lists of int lists: str() writes them as json.dumps does
    rendered = [('"Concrete Inputs": %s, "Input type": %s, "Input Strides": %s, '
                 '"Input Dims": %s, ' % (string_list(rec.concrete), string_list(rec.types),
                                         str(rec.strides), str(rec.shapes)))
                if rec.types else "" for rec in decoded]
    return StringTable(rendered), sig
