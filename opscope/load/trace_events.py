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
Device-side events (GPU kernels, memcpy) are not read. The scan over the
events is in ``trace_scan``.

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
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.model.events import sort_order
from opscope.load.trace_inputs import encode_trace_inputs
from opscope.load.trace_scan import (OP_CATEGORIES, OpColumns, ScannedEvents, float_column,
                                     hashable, int_column, intern_values, op_columns, to_ns)
from opscope.load.trace_settings import (memory_records, trace_marks, trace_modules,
                                         trace_settings)
from opscope.model.records import (FLAG_PYTHON_FUNCTION, NO_INPUTS, NO_STACK, RECORD_DTYPE,
                                   SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION, RawSession)

_INPUT_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
_INPUT_FIELDS = itemgetter(*_INPUT_KEYS)
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
    """
    trace_events = doc["traceEvents"]
    found = ScannedEvents(trace_events)
    if python_functions is None:
        python_functions = python_function_rule(doc, found.python_functions()) \
            if found.is_python.any() else "counted"
    if python_functions == "absent":
        found.drop_python_functions()
    ops = found.ops
    cols = op_columns(ops)
    ts = float_column(cols.ts, "ts", path, ops, trace_events)
    dur = float_column(cols.dur, "dur", path, ops, trace_events)
    all_ts = [ts] + [np.array([e.get("ts")], dtype=np.float64)
                     for e in ([found.span] if found.span else [])]
    origin_us = int(math.floor(min((float(a.min()) for a in all_ts if len(a)), default=0.0)))
    start = to_ns(ts, origin_us)
    end = start + np.maximum(np.rint(dur * 1000.0).astype(np.int64), 0)
    tids, thread_index = intern_values(cols.tids)
    memory = memory_records(found.memory, origin_us, path, tids, trace_events)  # may add threads
    names, records, user_rows = _records(found, cols, start, end, thread_index, tids)
    records["flags"][found.is_python] = FLAG_PYTHON_FUNCTION
    inputs = _encode_inputs(cols.args, thread_index, len(tids), records)
    stack_ids, stack_table = _stacks(cols.args)
    flops = _flops(cols.args)
    order = sort_order(start, end)
    if len(order) and not np.array_equal(order, np.arange(len(order))):
        records = records[order]
        stack_ids = None if stack_ids is None else stack_ids[order]
        flops = None if flops is None else flops[order]
    options, metadata = trace_settings(doc)
    start_ns, stop_ns = _window(found.span, start, end, origin_us)
    return RawSession(
        records=records, inputs=inputs, names=names, start_ns=start_ns, stop_ns=stop_ns,
        thread_ids=[t if type(t) is int and -2 ** 63 <= t < 2 ** 63 else k
                    for k, t in enumerate(tids)],
        epoch_offset_ns=_epoch_offset(doc), collector="trace",
        process_id=_process_id(ops), memory=memory, metadata=metadata,
        stack_ids=stack_ids, stack_table=stack_table, flops=flops,
        marks=trace_marks(found.instants, origin_us, path, trace_events),
        modules=trace_modules(ops, cols.args, user_rows, options["with_modules"]),
        thread_names={t: n for t, n in found.thread_names.items() if isinstance(t, int)},
        options=options, link_backward_stacks=False, source_path=path,
        python_functions=python_functions)


def _records(found: ScannedEvents, cols: OpColumns, start: np.ndarray, end: np.ndarray,
             thread_index: np.ndarray, tids: List[Any]):
    """Names, records (trace order; inputs not yet encoded) and the user-range rows."""
    ops, args = found.ops, cols.args
    names, name_id = intern_values(cols.names)
    seq = int_column(list(map(methodcaller("get", "Sequence number", -1), args)), -1)
    fwd = int_column(list(map(methodcaller("get", "Fwd thread id", 0), args)), 0)
    cat_names, cat_id = intern_values(cols.cats)
    cat_scope = np.array([OP_CATEGORIES.get(c, OP_CATEGORIES.get(str(c).lower(), 0))
                          for c in cat_names], dtype=np.uint8)
    scope = cat_scope[cat_id] if len(ops) else np.zeros(0, dtype=np.uint8)
    scope[(fwd != 0) & (scope == SCOPE_FUNCTION)] = SCOPE_BACKWARD_FUNCTION
    user_rows = np.flatnonzero(cat_id == cat_names.index("user_annotation")) \
        if "user_annotation" in cat_names else np.zeros(0, dtype=np.int64)
    records = np.zeros(len(ops), dtype=RECORD_DTYPE)
    records["start_ns"] = start
    records["end_ns"] = end
    records["seq_nr"] = seq
    records["name_id"] = name_id
    records["thread_index"] = thread_index
    records["fwd_thread_id"] = np.clip(fwd, 0, 2 ** 32 - 1)
    records["rf_thread_id"] = _rf_thread_ids(found, ops, fwd, tids)[thread_index] \
        if len(ops) else 0
    records["scope"] = scope
    return [n if isinstance(n, str) else str(n) for n in names], records, user_rows


def _stacks(args: List[dict]) -> Tuple[Optional[np.ndarray], Optional[List[List[str]]]]:
    """Per record a stack id (NO_STACK: none) and the frames of each id, from ``Call stack``.

    (None, None) when no event has one. Equal texts share an id.
    """
    texts = list(map(methodcaller("get", "Call stack"), args))
    if texts.count(None) == len(texts):
        return None, None
    ids: Dict[str, int] = {}
    table: List[List[str]] = []
    out = np.full(len(texts), NO_STACK, dtype=np.int64)
    for i, text in enumerate(texts):
        if isinstance(text, str):
            k = ids.get(text)
            if k is None:
                k = ids[text] = len(table)
                table.append(split_call_stack(text))
            out[i] = k
    return out, table


def _flops(args: List[dict]) -> Optional[np.ndarray]:
    """Per record, the ``flops`` arg (0 where none); None when no event has one."""
    values = list(map(methodcaller("get", "flops", 0), args))
    return None if values.count(0) == len(values) else int_column(values, 0)


def _epoch_offset(doc: Dict[str, Any]) -> int:
    """``baseTimeNanoseconds``; one outside 1970..2096 (or not an integer) counts as absent."""
    base_ns = doc.get("baseTimeNanoseconds")
    return base_ns if type(base_ns) is int and 0 <= base_ns <= MAX_EPOCH_NS else 0


def _process_id(ops: List[dict]) -> int:
    pid = ops[0].get("pid") if ops else None
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


def _rf_thread_ids(found: ScannedEvents, ops: List[dict], fwd: np.ndarray,
                   tids: List[Any]) -> np.ndarray:
    """RecordFunction thread id per thread index (as ``Fwd thread id`` refers to it).

    A ``fwdbwd`` flow links a forward op (its start) to a backward node (its
    end) that names the forward op's thread; other threads get the smallest
    unused ids from 1, in order of appearance.
    """
    out = np.zeros(len(tids), dtype=np.int64)
    index = {t: i for i, t in enumerate(tids)}
    if found.flows_start and found.flows_end:
        backward = {(hashable(ops[i].get("tid")), ops[i].get("ts")): int(fwd[i])
                    for i in np.flatnonzero(fwd != 0).tolist()}
        for flow_id, s in found.flows_start.items():
            f = found.flows_end.get(flow_id)
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


try:  # optional: faster keys than repr() on traces with many recorded inputs
    from orjson import dumps as _fast_dumps
except ImportError:  # pragma: no cover - depends on the environment
    _fast_dumps = None


def _signature_key(values: tuple) -> object:
    """A hashable key equal for equal input lists."""
    if _fast_dumps is not None:
        try:
            return _fast_dumps(values)
        except (TypeError, ValueError):  # integers beyond 64 bits
            pass
    return repr(values)


def _encode_inputs(args: List[dict], thread_index: np.ndarray, n_threads: int,
                   records: np.ndarray) -> List[np.ndarray]:
    """Per-thread int64 input blobs; sets ``records["input_offset"]``.

    Identical inputs on a thread share one encoding (and offset).
    """
    records["input_offset"] = NO_INPUTS
    blobs: List[List[int]] = [[] for _ in range(n_threads)]
    offsets: List[Dict[str, int]] = [{} for _ in range(n_threads)]
    encoded: Dict[str, List[int]] = {}
    has = np.fromiter(map(dict.__contains__, args, repeat("Input Dims")), bool, len(args))
    has |= np.fromiter(map(dict.__contains__, args, repeat("Input type")), bool, len(args))
    rows = np.flatnonzero(has).tolist()
    threads = thread_index[rows].tolist()
    found: List[int] = []
    for i, t in zip(rows, threads):
        a = args[i]
        try:
            values = _INPUT_FIELDS(a)
        except KeyError:
            values = tuple(a.get(k) for k in _INPUT_KEYS)
        key = _signature_key(values)
        off = offsets[t].get(key)
        if off is None:
            enc = encoded.get(key)
            if enc is None:
                enc = encoded[key] = encode_trace_inputs(*values)
            off = offsets[t][key] = len(blobs[t])
            blobs[t].extend(enc)
        found.append(off)
    if rows:
        records["input_offset"][rows] = found
    return [np.array(b, dtype=np.int64) for b in blobs]
