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
import os
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.export.atomic import PathLike, atomic_text_writer
from opscope.model.records import (FLAG_MEMORY, SCOPE_BACKWARD_FUNCTION,
                                    SCOPE_FUNCTION, SCOPE_USER)
from opscope.model.session import OPTION_NAMES, ProfileSession

# Top-level keys this module writes itself; user metadata may not reuse them.
RESERVED_KEYS = frozenset({
    "schemaVersion", "deviceProperties", "trace_id", "displayTimeUnit",
    "baseTimeNanoseconds", "traceEvents", "traceName",
})
# torch writes these flags in this order, each only when the option is on
_FLAG_ORDER = ("with_stack", "profile_memory", "record_shapes", "with_modules", "with_flops")
_CHUNK_LINES = 8192


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def validate_metadata_json(key: str, text: str) -> Any:
    """Check one metadata entry and return its parsed JSON value.

    ``text`` must be strict JSON (no NaN/Infinity); ``key`` must be a string
    that is not one of the trace's own top-level keys. The API layer calls
    this when metadata is added, so a bad value fails where it was given.

    >>> validate_metadata_json("distributedInfo", '{"rank": 0}')
    {'rank': 0}
    >>> validate_metadata_json("note", "not json")
    Traceback (most recent call last):
    ...
    ValueError: metadata 'note': value is not valid JSON (Expecting value at position 0): 'not json'
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"metadata key must be a non-empty string, got {key!r}")
    if key in RESERVED_KEYS:
        raise ValueError(f"metadata key {key!r} is reserved by the Chrome trace format; "
                         f"reserved keys: {', '.join(sorted(RESERVED_KEYS))}")
    if not isinstance(text, str):
        raise ValueError(f"metadata {key!r}: value must be JSON text (str), "
                         f"got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise ValueError(f"metadata {key!r}: value is not valid JSON "
                         f"({err.msg} at position {err.pos}): {text[:80]!r}") from None
    except ValueError as err:
        raise ValueError(f"metadata {key!r}: value is not valid JSON ({err}): "
                         f"{text[:80]!r}") from None


def trace_window(session: ProfileSession) -> Tuple[int, int]:
    """(start, stop) of the recorded window in collector ns.

    The session's own start/stop when set, widened to cover every event;
    the events' extent when the session has none.
    """
    table = session.table
    start, stop = session.start_ns, session.stop_ns
    if len(table):
        first, last = int(table.start_ns.min()), int(table.end_ns.max())
        if stop > start:
            return min(start, first), max(stop, last)
        return first, last
    return (start, stop) if stop > start else (start, start)


def trace_header(session: ProfileSession) -> Dict[str, Any]:
    """Top-level keys before ``traceEvents``, in the order they are written.

    Option flags appear (as ``1``) only when on, like torch; then each user
    metadata entry as a parsed JSON value, which may override a flag.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> s.options["record_shapes"] = True
    >>> s.metadata["distributedInfo"] = '{"rank": 0}'
    >>> list(trace_header(s))  # doctest: +NORMALIZE_WHITESPACE
    ['schemaVersion', 'deviceProperties', 'record_shapes', 'distributedInfo',
     'trace_id', 'displayTimeUnit', 'baseTimeNanoseconds']
    """
    header: Dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    for flag in _FLAG_ORDER + tuple(n for n in OPTION_NAMES if n not in _FLAG_ORDER):
        if session.options.get(flag):
            header[flag] = 1
    for key, text in session.metadata.items():
        header[key] = validate_metadata_json(key, text)
    header["trace_id"] = uuid.uuid4().hex.upper()
    header["displayTimeUnit"] = "ms"
    header["baseTimeNanoseconds"] = _base_time_ns(session)
    return header


def _base_time_ns(session: ProfileSession) -> int:
    # Unix time of the window start, rounded down to a whole second: ts stay
    # small (a double holds them to the ns) and never negative.
    start, _ = trace_window(session)
    return (start + session.epoch_offset_ns) // 1_000_000_000 * 1_000_000_000


def forward_backward_links(session: ProfileSession) -> List[Tuple[int, int]]:
    """(forward row, backward row) pairs for ``fwdbwd`` flows, backward time order.

    A backward event (scope BACKWARD_FUNCTION, ``seq_nr >= 0``) links to the
    outermost forward op with the same ``seq_nr`` whose ``rf_thread_id`` is the
    backward's ``fwd_thread_id``. A forward op has scope FUNCTION and
    ``fwd_thread_id`` 0 (ops run by the autograd engine carry the forward
    thread there, so they are never taken for the forward op).
    """
    t = session.table
    scope, seq = t.scope, t.seq_nr
    fwd_rows = np.flatnonzero((scope == SCOPE_FUNCTION) & (seq >= 0) & (t.fwd_thread_id == 0))
    bwd_rows = np.flatnonzero((scope == SCOPE_BACKWARD_FUNCTION) & (seq >= 0))
    if len(fwd_rows) == 0 or len(bwd_rows) == 0:
        return []
    # rows are in (start, -end) order, so the first row of a key is the outermost;
    # building the dict backwards lets the first row win
    keys = zip(t.rf_thread_id[fwd_rows[::-1]].tolist(), seq[fwd_rows[::-1]].tolist())
    first = dict(zip(keys, fwd_rows[::-1].tolist()))
    links = []
    for b, ft, s in zip(bwd_rows.tolist(), t.fwd_thread_id[bwd_rows].tolist(),
                        seq[bwd_rows].tolist()):
        f = first.get((ft, s))
        if f is not None:
            links.append((f, b))
    return links


class _LineWriter:
    """Joins JSON lines with ``,\\n`` and writes them in chunks."""

    def __init__(self, stream):
        self.stream = stream
        self.lines: List[str] = []
        self.started = False

    def add(self, line: str) -> None:
        self.lines.append(line)
        if len(self.lines) >= _CHUNK_LINES:
            self.flush()

    def extend(self, lines: List[str]) -> None:
        self.flush()
        self.lines = lines
        self.flush()

    def flush(self) -> None:
        if self.lines:
            self.stream.write((",\n" if self.started else "") + ",\n".join(self.lines))
            self.started = True
            self.lines = []


def write_chrome_trace(session: ProfileSession, path: PathLike) -> str:
    """Write ``session`` as a Chrome trace JSON file (gzip when ``path`` ends in .gz).

    The write is atomic; metadata that is not valid JSON raises ``ValueError``
    naming its key before anything is written. Returns the path as a string.

    >>> import gzip, json, os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json.gz")
    >>> _ = write_chrome_trace(build_session(RawSession.empty()), path)
    >>> "traceEvents" in json.load(gzip.open(path, "rt"))
    True
    """
    path = os.fspath(path)
    header = trace_header(session)
    with atomic_text_writer(path) as f:
        f.write("{\n")
        for key, value in header.items():
            f.write(f"  {json.dumps(key)}: {json.dumps(value, allow_nan=False)},\n")
        f.write('  "traceEvents": [\n')
        lines = _LineWriter(f)
        _write_events(session, header["baseTimeNanoseconds"], lines)
        lines.flush()
        f.write(f'\n  ],\n  "traceName": {json.dumps(path)}\n}}\n')
    return path


def _us(ns: int) -> str:
    """Nanoseconds as a JSON number of microseconds with three decimals (exact).

    >>> _us(1_234_567), _us(5), _us(-1_500)
    ('1234.567', '0.005', '-1.500')
    """
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(ns), 1000)
    return f"{sign}{q}.{r:03d}"


def _write_events(session: ProfileSession, base_ns: int, out: _LineWriter) -> None:
    table = session.table
    pid = int(session.process_id)
    # collector ns -> ns since base, in exact integers
    shift = session.epoch_offset_ns - base_ns
    win_start, win_stop = trace_window(session)
    start_us = _us(win_start + shift)

    meta = '{"ph": "M", "name": "%s", "ts": %s, "pid": %d, "tid": %d, "args": {"%s": %s}}'
    out.add(meta % ("process_name", start_us, pid, 0, "name", '"python"'))
    out.add(meta % ("process_labels", start_us, pid, 0, "labels", '"CPU"'))
    out.add(meta % ("process_sort_index", start_us, pid, 0, "sort_index", pid))
    if len(table):
        uniq, first_row = np.unique(table.os_tid, return_index=True)
        for tid in uniq[np.argsort(first_row)].tolist():
            out.add(meta % ("thread_name", start_us, pid, tid, "name",
                            json.dumps(f"thread {tid} (python)")))
            out.add(meta % ("thread_sort_index", start_us, pid, tid, "sort_index", tid))

    # ts/dur as whole microseconds and the ns remainder: exact at any magnitude,
    # and formatting two small ints is faster than repr() of a float
    ts_ns = table.start_ns + shift
    dur_ns = np.maximum(table.end_ns - table.start_ns, 0)
    ts = (ts_ns // 1000).tolist(), (ts_ns % 1000).tolist()
    dur = (dur_ns // 1000).tolist(), (dur_ns % 1000).tolist()
    tids = table.os_tid.tolist()
    _write_ops(session, pid, tids, ts, dur, out)
    _write_marks(session, pid, shift, out)

    flow = ('{"ph": "%s", "id": %d, "pid": %d, "tid": %d, "ts": %d.%03d, '
            '"cat": "fwdbwd", "name": "fwdbwd"%s}')
    for k, (fwd, bwd) in enumerate(forward_backward_links(session), start=1):
        out.add(flow % ("s", k, pid, tids[fwd], ts[0][fwd], ts[1][fwd], ""))
        out.add(flow % ("f", k, pid, tids[bwd], ts[0][bwd], ts[1][bwd], ', "bp": "e"'))

    if session.memory is not None:
        _write_memory(session, pid, shift, out)

    out.add('{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", '
            '"tid": "PyTorch Profiler", "ts": %s, "dur": %s, "args": {"Op count": 0}}'
            % (start_us, _us(win_stop - win_start)))
    out.add('{"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", '
            '"pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": %s}' % start_us)
    out.add('{"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", '
            '"ts": %s}' % _us(win_stop + shift))


def _write_ops(session: ProfileSession, pid: int, tids: List[int],
               ts: Tuple[List[int], List[int]], dur: Tuple[List[int], List[int]],
               out: _LineWriter) -> None:
    """One ``X`` line per table row, handed to ``out`` a chunk at a time.

    ``ts`` and ``dur`` are (whole us, ns remainder) columns. The fixed fields
    are %-formatted around strings that were ``json.dumps``-ed once per
    distinct name: about three times faster than dumping a dict per event,
    and as safe (numbers cannot break JSON, no string is hand-escaped).
    """
    table = session.table
    # '"cat": ..., "name": ...' per (is-user-range, name) pair
    heads = [[f'"cat": "{cat}", "name": {json.dumps(name)}' for name in table.symbols.names]
             for cat in ("cpu_op", "user_annotation")]
    head_col = [heads[u][k] for u, k in zip((table.scope == SCOPE_USER).tolist(),
                                            table.name_id.tolist())]
    extras = _extra_args(session)
    prefix = '{"ph": "X", %%s, "pid": %d, "tid": %%d, "ts": %%d.%%03d, "dur": %%d.%%03d, ' % pid
    seq_args = '"Sequence number": %d, "Fwd thread id": %d, '
    with_seq = prefix + ('"args": {"External id": %d, ' + seq_args +
                         '"Record function id": 0, %s"Ev Idx": %d}}')
    without_seq = prefix + '"args": {"External id": %d, "Record function id": 0, %s"Ev Idx": %d}}'
    chunk: List[str] = []
    append = chunk.append
    rows = zip(range(len(table)), head_col, tids, ts[0], ts[1], dur[0], dur[1],
               table.seq_nr.tolist(), table.fwd_thread_id.tolist(), extras)
    is_memory = (table.flags & FLAG_MEMORY) != 0
    if is_memory.any():  # [memory] rows are written as instant events instead
        rows = (row for row, skip in zip(rows, is_memory.tolist()) if not skip)
    for i, head, tid, tq, tr, dq, dr, seq, fwd, extra in rows:
        if seq >= 0:
            append(with_seq % (head, tid, tq, tr, dq, dr, i + 1, seq, fwd, extra, i))
        else:
            append(without_seq % (head, tid, tq, tr, dq, dr, i + 1, extra, i))
        if len(chunk) >= _CHUNK_LINES:
            out.extend(chunk)
            chunk = []
            append = chunk.append
    out.extend(chunk)


def _extra_args(session: ProfileSession) -> List[str]:
    """Per event, the args it has beyond the fixed ones ('' for most): recorded inputs,
    module and FLOP args, and the ``Call stack``. Each distinct input signature and
    each distinct stack is rendered once."""
    table = session.table
    parts = [_input_args_by_event(table)]
    module_args = _module_and_flops_args(session)
    if module_args is not None:
        parts.append(module_args)
    if session.stacks is not None:
        rendered: Dict[int, str] = {}

        def call_stack(stack) -> str:
            if not stack:
                return ""
            text = rendered.get(id(stack))
            if text is None:  # torch: innermost frame first, each followed by ';'
                text = rendered[id(stack)] = '"Call stack": %s, ' % json.dumps(
                    ";".join(stack) + ";")
            return text

        parts.append([call_stack(st) for st in session.stacks])
    if len(parts) == 1:
        return parts[0]
    return ["".join(p) for p in zip(*parts)]


def _write_memory(session: ProfileSession, pid: int, shift: int, out: _LineWriter) -> None:
    """One ``[memory]`` instant event per allocator record, with torch's args."""
    mem = session.memory
    table = session.table
    tid_of = table.thread_ids.tolist()
    line = ('{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", '
            '"pid": %d, "tid": %d, "ts": %d.%03d, "args": {"Total Reserved": %d, '
            '"Total Allocated": %d, "Bytes": %d, "Device Id": %d, "Device Type": %d, '
            '"Addr": %d, "finished": false, "Ev Idx": %d}}')
    ts_ns = mem["time_ns"] + shift
    first_idx = len(table)
    chunk: List[str] = []
    for k, (thread, tq, tr, reserved, allocated, nbytes, dev_id, dev_type, addr) in enumerate(zip(
            mem["thread_index"].tolist(), (ts_ns // 1000).tolist(), (ts_ns % 1000).tolist(),
            mem["total_reserved"].tolist(), mem["total_allocated"].tolist(),
            mem["bytes"].tolist(), mem["device_index"].tolist(), mem["device_type"].tolist(),
            mem["addr"].tolist())):
        tid = tid_of[thread] if thread < len(tid_of) else 0
        chunk.append(line % (pid, tid, tq, tr, reserved, allocated, nbytes, dev_id, dev_type,
                             addr, first_idx + k))
        if len(chunk) >= _CHUNK_LINES:
            out.extend(chunk)
            chunk = []
    out.extend(chunk)


def _write_marks(session: ProfileSession, pid: int, shift: int, out: _LineWriter) -> None:
    """One thread-scoped instant event (``"ph": "i", "s": "t"``) per ``opscope.itt.mark``.

    ``cpu_instant_event`` is the category Kineto gives CPU instant events.
    """
    for ns, tid, name in session.marks:
        out.add('{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": %s, "pid": %d, '
                '"tid": %d, "ts": %s}' % (json.dumps(name), pid, tid, _us(ns + shift)))


def _module_and_flops_args(session: ProfileSession) -> Optional[List[str]]:
    """Per event, its rendered module and FLOP args ('' when none); None when neither.

    An op gets ``"Module Hierarchy"`` (``Model.encoder.0``) and, with a non-zero
    estimate, ``"flops"``. A module range (``with_modules``) is marked by
    ``"Module Class"``, ``"Module Path"``, ``"Module Hierarchy"`` and
    ``"Module Parameters"`` (see ``opscope.model.modules``).
    """
    if session.modules is None and session.flops is None:
        return None
    n = len(session.table)
    out = [""] * n
    if session.modules is not None:
        from opscope.analysis.modules import module_hierarchy, module_mask

        hierarchy = module_hierarchy(session)
        rendered: Dict[str, str] = {}
        for i, text in enumerate(hierarchy):
            if text:
                if text not in rendered:
                    rendered[text] = '"Module Hierarchy": %s, ' % json.dumps(text)
                out[i] = rendered[text]
        for i in np.flatnonzero(module_mask(session)).tolist():
            info = session.modules[session.table.name(i)]
            out[i] = "".join("%s: %s, " % (json.dumps(k), json.dumps(v))
                             for k, v in info.trace_args().items())
    if session.flops is not None:
        for i in np.flatnonzero(session.flops > 0).tolist():
            out[i] += '"flops": %d, ' % int(session.flops[i])
    return out


def _input_args_by_event(table) -> List[str]:
    """Per event, its rendered input args ('' when none); each distinct signature once.

    A record without inputs (a user range) gets none, as torch writes its ranges.
    """
    sig, decoded = table.input_signatures()
    if not decoded:
        return [""] * len(table)
    rendered = [('"Concrete Inputs": %s, "Input type": %s, "Input Strides": %s, '
                 '"Input Dims": %s, ' % (json.dumps(rec.concrete), json.dumps(rec.types),
                                         json.dumps(rec.strides), json.dumps(rec.shapes)))
                if rec.types else "" for rec in decoded] + [""]
    return [rendered[k] for k in sig.tolist()]  # -1 picks the trailing ""
