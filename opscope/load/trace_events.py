"""Turn a parsed Chrome trace into the recorded-session model (``RawSession``).

Works for traces written by opscope and by torch.profiler (Kineto): every
``X`` event of category ``cpu_op`` or ``user_annotation`` (also the CPU-side
``cuda_runtime``/``cuda_driver`` calls, and ``Operator``/``Runtime`` of older
Kineto) becomes one record, as a collector would have written it.

``python_function`` events (torch's ``with_stack``) follow the rule of the
torch that wrote the trace (``python_function_rule``), as its own
``key_averages()`` treated them:

- ``"absent"`` (torch 2.4 to 2.8): not events at all; they are dropped here;
- ``"counted"`` (torch 2.13): events and ``key_averages`` rows, ops nest under them;
- ``"hidden"`` (torch 2.15): events (ops nest under them, so their parents'
  self times exclude them) but not ``key_averages`` rows by default;
  ``build_session`` drops their rows after the tree is built.

Their records carry ``FLAG_PYTHON_FUNCTION``, and the rule goes in
``RawSession.python_functions``.

- ``ts``/``dur`` (microseconds, three decimals) become integer nanoseconds;
  the clock is "nanoseconds since ``baseTimeNanoseconds``", which is the
  epoch offset, so opscope's traces keep their Unix times exactly;
- ``Sequence number``/``Fwd thread id`` fill ``seq_nr``/``fwd_thread_id``; an
  event with a non-zero forward thread is a backward node
  (``SCOPE_BACKWARD_FUNCTION``), ``user_annotation`` is ``SCOPE_USER``;
- the RecordFunction thread id of each thread comes from the ``fwdbwd`` flows
  (a forward op's thread is the ``Fwd thread id`` of its backward node);
- ``Input Dims``/``Input type``/``Input Strides``/``Concrete Inputs`` are
  re-encoded (see ``trace_inputs``); ``Call stack`` ("f(1): a;g(2): b;",
  innermost first) is split into frames.

``[memory]`` instant events become the allocator records of ``raw.memory``
(``records.MEMORY_DTYPE``), which ``build_session`` attributes to ops as it
does for a live profile; they, the settings, marks and modules are read by
``trace_settings``. Records come out sorted by ``(start, -end)``.
Device-side events (kernels, memcpy, memset) become ``raw.device`` records
(``trace_device``), linked to their launching calls by ``correlation``. The scan over the
events is in ``trace_scan``; ``trace_columns`` gathers them into columns a batch
at a time (``trace_stream`` reads a file that way), and ``columns_session``
here turns the columns into the session.

Example::

    >>> doc = {"traceEvents": [
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 7,
    ...      "ts": 10.5, "dur": 2.25, "args": {"Input Dims": [[2], [2]]}}]}
    >>> raw = trace_session(doc, "t.json")
    >>> raw.names, raw.records["start_ns"].tolist(), raw.records["end_ns"].tolist()
    (['aten::add'], [10500], [12750])
    >>> raw.inputs_of(0, 0).shapes
    [[2], [2]]
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.model.events import sort_order
from opscope.load.trace_inputs import encode_trace_inputs
from opscope.load.trace_columns import (NO_TEXT, EventPositions, Interned, TraceColumns,
                                        first_seen)
from opscope.load.trace_scan import OP_CATEGORIES, hashable, to_ns
from opscope.load.trace_settings import (memory_records, trace_marks, trace_modules,
                                         trace_settings)
from opscope.load.trace_device import device_records
from opscope.model.records import (FLAG_ASYNC, FLAG_CUDA_DRIVER, FLAG_CUDA_RUNTIME,
                                   FLAG_PYTHON_FUNCTION, NO_INPUTS, NO_STACK, RECORD_DTYPE,
                                   SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION, RawSession)
from opscope.model.torch_names import COLLECTIVE_RANGE_PREFIXES

MAX_EPOCH_NS = 4 * 10 ** 18  # baseTimeNanoseconds past this (year 2096) is not a clock

# What a trace's python_function events are to the torch that wrote it (see the module doc).
PYTHON_FUNCTION_RULES = ("absent", "counted", "hidden")


def python_function_rule(doc: Dict[str, Any], python_events: List[dict]) -> str:
    """Which of ``PYTHON_FUNCTION_RULES`` the torch that wrote ``doc`` applied.

    Told by what each torch writes (checked on 2.4.1, 2.8.0, 2.13.0, 2.15.0):
    torch 2.15 gives each ``python_function`` event a ``CallFrom`` arg, and
    hides them from ``key_averages``; torch 2.13 writes a top-level
    ``host_name`` (2.4 and 2.8 do not) and counts them as events.

    >>> python_function_rule({}, [{"args": {"CallFrom": "a.py:3"}}])
    'hidden'
    >>> python_function_rule({"host_name": "vm"}, [{"args": {"Python id": 1}}])
    'counted'
    >>> python_function_rule({}, [{"args": {"Python id": 1}}])
    'absent'
    """
    for event in python_events[:64]:  # every event of a torch version has the same args
        args = event.get("args")
        if isinstance(args, dict) and "CallFrom" in args:
            return "hidden"
    return "counted" if "host_name" in doc else "absent"


def split_call_stack(text: str) -> List[str]:
    """Frames of a ``Call stack`` arg, innermost first.

    >>> split_call_stack("a.py(3): f;b.py(9): <module>;")
    ['a.py(3): f', 'b.py(9): <module>']
    """
    frames = text.split(";")
    if frames and frames[-1] == "":
        frames.pop()
    return frames


def trace_session(doc: Dict[str, Any], path: str,
                  python_functions: Optional[str] = None) -> RawSession:
    """The RawSession of a parsed trace: records, inputs, stacks, memory, settings.

    ``path`` names the file in error messages and becomes ``source_path``.
    ``python_functions`` is one of ``PYTHON_FUNCTION_RULES``, or None for the
    rule of the torch that wrote the trace (``python_function_rule``).
    The events are one batch of ``TraceColumns``, as ``trace_stream`` reads
    a file's in many.
    """
    cols = TraceColumns(path)
    cols.add(doc["traceEvents"], 0)
    return columns_session(cols, doc, python_functions)


def columns_session(cols: TraceColumns, doc: Dict[str, Any],
                    python_functions: Optional[str] = None) -> RawSession:
    """The RawSession of a trace's gathered columns and its other top-level keys ``doc``."""
    path = cols.path
    python = cols.column("python").astype(bool)
    if python_functions is None:
        python_functions = python_function_rule(doc, cols.python_events) \
            if python.any() else "counted"
    keep = ~python if python_functions == "absent" and python.any() else None
    _raise_first_bad_time(cols, keep)
    ops = _KeptOps(cols, keep)
    ts, dur = ops.column("ts"), ops.column("dur")
    all_ts = [ts] + [np.array([cols.span.get("ts")], dtype=np.float64)
                     for _ in ([cols.span] if cols.span else [])]
    origin_us = int(math.floor(min((float(a.min()) for a in all_ts if len(a)), default=0.0)))
    start = to_ns(ts, origin_us)
    end = np.rint(dur * 1000.0).astype(np.int64)
    del ts, dur, all_ts  # a large trace's columns are held once: each goes when used
    np.maximum(end, 0, out=end)
    end += start
    tids, thread_index = ops.interned("tid", cols.tids)
    memory = memory_records(cols.memory, origin_us, path, tids,  # may add threads
                            EventPositions(cols.memory, cols.positions[0]))
    names, records, user_rows = _records(cols, ops, start, end, thread_index, tids)
    start, end = records["start_ns"], records["end_ns"]  # views: the arrays go
    records["flags"][ops.column("python").astype(bool)] = FLAG_PYTHON_FUNCTION
    records["flags"][_async_rows(names, records, user_rows)] |= FLAG_ASYNC
    correlation, device, device_names = _device_side(cols, ops, origin_us, records)
    inputs = _encode_inputs(ops, cols, thread_index, len(tids), records)
    stack_ids, stack_table = _stacks(ops, cols)
    flops = ops.column("flops") if "flops" in cols.batches and \
        ops.column("has_flops").any() else None
    order = sort_order(start, end)
    fused = _sparse_records(cols.fused, cols.count, keep, order)
    collective_facts = _sparse_records(cols.collective_facts, cols.count, keep, order)
    if len(order) and not np.array_equal(order, np.arange(len(order))):
        records = records[order]
        correlation = None if correlation is None else correlation[order]
        stack_ids = None if stack_ids is None else stack_ids[order]
        flops = None if flops is None else flops[order]
    options, metadata = trace_settings(doc)
    start_ns, stop_ns = _window(cols.span, start, end, origin_us)
    return RawSession(
        records=records, inputs=inputs, names=names, start_ns=start_ns, stop_ns=stop_ns,
        thread_ids=[t if type(t) is int and -2 ** 63 <= t < 2 ** 63 else k
                    for k, t in enumerate(tids)],
        epoch_offset_ns=_epoch_offset(doc), collector="trace",
        process_id=_process_id(cols.pids.get(keep is None)), memory=memory, metadata=metadata,
        stack_ids=stack_ids, stack_table=stack_table, flops=flops,
        marks=trace_marks(cols.instants, origin_us, path,
                          EventPositions(cols.instants, cols.positions[1])),
        modules=trace_modules([{"name": name} for _, name, _ in cols.modules],
                              [a for _, _, a in cols.modules],
                              np.arange(len(cols.modules)), options["with_modules"]),
        thread_names={t: n for t, n in cols.thread_names.items() if isinstance(t, int)},
        options=options, link_backward_stacks=False, source_path=path,
        python_functions=python_functions, device=device, device_names=device_names,
        correlation=correlation, fused_modules=fused, collective_facts=collective_facts)


def _sparse_records(by_op: Dict[int, Any], count: int, keep: Optional[np.ndarray],
                    order: np.ndarray) -> Dict[int, Any]:
    """Record index -> value of the kept ops in ``by_op`` (op index -> value; records:
    ``order``), e.g. the "Fused Modules" or a collective's facts."""
    if not by_op:
        return {}
    kept = np.arange(count) if keep is None else np.cumsum(keep) - 1
    record = np.empty(len(order), dtype=np.int64)
    record[order] = np.arange(len(order))
    return {int(record[kept[op]]): value for op, value in by_op.items()
            if keep is None or keep[op]}


def _device_side(cols: TraceColumns, ops: "_KeptOps", origin_us: int, records: np.ndarray):
    """The correlation ids of the API call rows (flagged as such), and the device records.

    (None, None, []) for a trace with no device events.
    """
    if not cols.device:
        return None, None, []
    cat_names, cat_id = ops.interned("cat", cols.cats)
    for flag, cat in ((FLAG_CUDA_RUNTIME, "cuda_runtime"), (FLAG_CUDA_DRIVER, "cuda_driver")):
        if cat in cat_names:
            records["flags"][cat_id == cat_names.index(cat)] |= flag
    device, names = device_records(cols.device, origin_us)
    correlation = ops.column("corr").astype(np.uint32) if "corr" in cols.batches \
        else np.zeros(len(records), np.uint32)
    return correlation, device, names


def _raise_first_bad_time(cols: TraceColumns, keep: Optional[np.ndarray]) -> None:
    """Raise the error of the first kept op with a bad ``ts``, else a bad ``dur``."""
    for what in ("ts", "dur"):
        found = [cols.bad[(what, python)] for python in (False, True)
                 if (what, python) in cols.bad and (keep is None or not python)]
        if found:
            raise min(found, key=lambda f: f[0])[1]


class _KeptOps:
    """The columns of the ops that become records (all, or all but Python functions)."""

    def __init__(self, cols: TraceColumns, keep: Optional[np.ndarray]) -> None:
        self.cols, self.keep = cols, keep

    def column(self, name: str) -> np.ndarray:
        values = self.cols.column(name)
        return values if self.keep is None else values[self.keep]

    def interned(self, name: str, table: Interned) -> Tuple[List[Any], np.ndarray]:
        """(distinct values in first-seen order, the id of each kept op's value)."""
        codes = self.column(name)
        if self.keep is None:  # provisional ids are already in first-seen order
            return list(table.values), codes.astype(np.int32)
        values, out = first_seen(codes, table.values)
        return values, out.astype(np.int32)


def _records(cols: TraceColumns, ops: _KeptOps, start: np.ndarray, end: np.ndarray,
             thread_index: np.ndarray, tids: List[Any]):
    """Names, records (trace order; inputs not yet encoded) and the user-range rows."""
    records = np.zeros(len(start), dtype=RECORD_DTYPE)
    names, name_id = ops.interned("name", cols.names)
    records["name_id"] = name_id
    del name_id
    records["seq_nr"] = ops.column("seq")
    fwd = ops.column("fwd")
    cat_names, cat_id = ops.interned("cat", cols.cats)
    cat_scope = np.array([OP_CATEGORIES.get(c, OP_CATEGORIES.get(str(c).lower(), 0))
                          for c in cat_names], dtype=np.uint8)
    scope = cat_scope[cat_id] if len(start) else np.zeros(0, dtype=np.uint8)
    scope[(fwd != 0) & (scope == SCOPE_FUNCTION)] = SCOPE_BACKWARD_FUNCTION
    user_rows = np.flatnonzero(cat_id == cat_names.index("user_annotation")) \
        if "user_annotation" in cat_names else np.zeros(0, dtype=np.int64)
    records["start_ns"] = start
    records["end_ns"] = end
    records["thread_index"] = thread_index
    records["fwd_thread_id"] = np.clip(fwd, 0, 2 ** 32 - 1)
    flows = cols.flows_start and cols.flows_end  # only they need the times again
    records["rf_thread_id"] = _rf_thread_ids(cols, ops.column("ts") if flows else None,
                                             thread_index, fwd, tids)[thread_index] \
        if len(start) else 0
    records["scope"] = scope
    return [n if isinstance(n, str) else str(n) for n in names], records, user_rows


def _async_rows(names: List[str], records: np.ndarray, user_rows: np.ndarray) -> np.ndarray:
    """The user ranges torch records as async, which a trace does not say: a collective's
    backend range (``gloo:all_reduce``), which c10d's Work always marks async, since another
    thread may end it. torch's table then gives it no CPU total %, live or loaded."""
    ids = [k for k, n in enumerate(names) if n.startswith(COLLECTIVE_RANGE_PREFIXES)]
    if not ids or len(user_rows) == 0:
        return np.zeros(0, dtype=np.int64)
    return user_rows[np.isin(records["name_id"][user_rows], ids)]


def _stacks(ops: _KeptOps, cols: TraceColumns
            ) -> Tuple[Optional[np.ndarray], Optional[List[List[str]]]]:
    """Per record a stack id (NO_STACK: none) and the frames of each id, from ``Call stack``.

    (None, None) when no event has one. Equal texts share an id.
    """
    codes = ops.column("stack")
    if not cols.has_stacks or not (codes != NO_TEXT).any():
        return None, None
    texts, out = first_seen(codes, cols.stacks.values)
    out[out < 0] = NO_STACK
    return out.astype(np.int64), [split_call_stack(t) for t in texts]


def _epoch_offset(doc: Dict[str, Any]) -> int:
    """``baseTimeNanoseconds``; one outside 1970..2096 (or not an integer) counts as absent."""
    base_ns = doc.get("baseTimeNanoseconds")
    return base_ns if type(base_ns) is int and 0 <= base_ns <= MAX_EPOCH_NS else 0


def _process_id(pid: Any) -> int:
    return pid if type(pid) is int and -2 ** 63 <= pid < 2 ** 63 else 0


def _window(span: Optional[dict], start: np.ndarray, end: np.ndarray, origin_us: int):
    """(start, stop) of the recorded window: the trace's span event, else the ops' extent."""
    if span is not None:
        try:
            s = int(to_ns(np.array([span["ts"]], dtype=np.float64), origin_us)[0])
            d = int(round(float(span.get("dur", 0)) * 1000))
            if d >= 0:
                return s, s + d
        except (KeyError, TypeError, ValueError):
            pass
    if len(start):
        return int(start.min()), int(end.max())
    return 0, 0


def _rf_thread_ids(cols: TraceColumns, ts: Optional[np.ndarray], thread_index: np.ndarray,
                   fwd: np.ndarray, tids: List[Any]) -> np.ndarray:
    """RecordFunction thread id per thread index (as ``Fwd thread id`` refers to it).

    A ``fwdbwd`` flow links a forward op (its start) to a backward node (its
    end) that names the forward op's thread; other threads get the smallest
    unused ids from 1, in order of appearance.
    """
    out = np.zeros(len(tids), dtype=np.int64)
    index = {t: i for i, t in enumerate(tids)}
    if cols.flows_start and cols.flows_end:
        rows = np.flatnonzero(fwd != 0)
        backward = dict(zip(zip([tids[k] for k in thread_index[rows].tolist()],
                                ts[rows].tolist()), fwd[rows].tolist()))
        for flow_id, s in cols.flows_start.items():
            f = cols.flows_end.get(flow_id)
            if f is None:
                continue
            thread = index.get(hashable(s.get("tid")))
            rf = backward.get((hashable(f.get("tid")), hashable(f.get("ts"))))
            if thread is not None and rf and out[thread] == 0:
                out[thread] = rf
    used = set(out.tolist())
    next_id = 1
    for k in range(len(out)):
        if out[k] == 0:
            while next_id in used:
                next_id += 1
            out[k] = next_id
            used.add(next_id)
    return out


def _encode_inputs(ops: _KeptOps, cols: TraceColumns, thread_index: np.ndarray,
                   n_threads: int, records: np.ndarray) -> List[np.ndarray]:
    """Per-thread int64 input blobs; sets ``records["input_offset"]``.

    Identical inputs on a thread share one encoding (and offset).
    """
    records["input_offset"] = NO_INPUTS
    blobs: List[List[int]] = [[] for _ in range(n_threads)]
    offsets: List[Dict[int, int]] = [{} for _ in range(n_threads)]
    encoded: Dict[int, List[int]] = {}
    sig = ops.column("sig")
    rows = np.flatnonzero(sig >= 0)
    found: List[int] = []
    for key, t in zip(sig[rows].tolist(), thread_index[rows].tolist()):
        off = offsets[t].get(key)
        if off is None:
            enc = encoded.get(key)
            if enc is None:
                enc = encoded[key] = encode_trace_inputs(*cols.signature_values[key])
            off = offsets[t][key] = len(blobs[t])
            blobs[t].extend(enc)
        found.append(off)
    if len(rows):
        records["input_offset"][rows] = found
    return [np.array(b, dtype=np.int64) for b in blobs]
