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
  self times exclude them) but not ``key_averages`` rows by default; the
  loader drops their rows after the tree is built.

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
does for a live profile. Records come out sorted by ``(start, -end)``.
Device-side events (GPU kernels, memcpy) are not read. The scan over the
events is in ``trace_scan``.

Example::

    >>> doc = {"traceEvents": [
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 7,
    ...      "ts": 10.5, "dur": 2.25, "args": {"Input Dims": [[2], [2]]}}]}
    >>> c = trace_contents(doc, "t.json")
    >>> c.raw.names, c.raw.records["start_ns"].tolist(), c.raw.records["end_ns"].tolist()
    (['aten::add'], [10500], [12750])
    >>> c.raw.inputs_of(0, 0).shapes
    [[2], [2]]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.model.events import sort_order
from opscope.model.records import (MEMORY_DTYPE, NO_INPUTS, RECORD_DTYPE,
                                   SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION, RawSession)
from opscope.model.session import OPTION_NAMES
from opscope.model.trace_inputs import encode_trace_inputs
from opscope.model.trace_scan import (OP_CATEGORIES, ScannedEvents, float_column, int_column,
                                      intern_values, op_columns, to_ns)

# Top-level keys that describe the file, not the session (never kept as metadata).
FORMAT_KEYS = frozenset({
    "schemaVersion", "deviceProperties", "trace_id", "displayTimeUnit",
    "baseTimeNanoseconds", "traceEvents", "traceName",
})
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


@dataclass
class TraceContents:
    """What a trace holds, in model terms: the records and what goes beside them.

    ``stacks`` is per record (same order as ``raw.records``), or None when the
    trace has no ``Call stack`` args at all. ``is_python_function`` is per
    record too: True where it came from a ``python_function`` event (None when
    none did);
    ``module_args`` maps the name of each ``user_annotation`` range that marks
    a module (its args have ``Module Class``) to those args. ``flops`` is per
    record, from the ``flops`` args (None when no event has one). ``marks``
    are the other CPU instant events, as ``ProfileSession.marks`` holds them.
    """

    raw: RawSession
    stacks: Optional[List[Optional[List[str]]]]
    options: Dict[str, bool]
    metadata: Dict[str, str]
    is_python_function: Optional[np.ndarray] = None
    module_args: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    flops: Optional[np.ndarray] = None
    marks: List[Tuple[int, int, str]] = field(default_factory=list)
    thread_names: Dict[int, str] = field(default_factory=dict)
    python_functions: str = "counted"


def split_call_stack(text: str) -> List[str]:
    """Frames of a ``Call stack`` arg, innermost first.

    >>> split_call_stack("a.py(3): f;b.py(9): <module>;")
    ['a.py(3): f', 'b.py(9): <module>']
    """
    frames = text.split(";")
    if frames and frames[-1] == "":
        frames.pop()
    return frames


def trace_contents(doc: Dict[str, Any], path: str,
                   python_functions: Optional[str] = None) -> TraceContents:
    """Build the records, stacks, memory events and settings of a parsed trace.

    ``path`` is only used in error messages. ``python_functions`` is one of
    ``PYTHON_FUNCTION_RULES``, or None for the rule of the torch that wrote
    the trace (``python_function_rule``).
    """
    trace_events = doc["traceEvents"]
    found = ScannedEvents(trace_events)
    if python_functions is None:
        python_functions = python_function_rule(doc, found.python_functions()) \
            if found.is_python.any() else "counted"
    if python_functions == "absent":
        found.drop_python_functions()
    ops = found.ops
    base_ns = doc.get("baseTimeNanoseconds")
    # an epoch offset outside 1970..2096 (or not an integer) is ignored, as if absent
    epoch_offset_ns = base_ns if type(base_ns) is int and 0 <= base_ns <= MAX_EPOCH_NS else 0

    cols = op_columns(ops)
    ts = float_column(cols.ts, "ts", path, ops, trace_events)
    dur = float_column(cols.dur, "dur", path, ops, trace_events)
    all_ts = [ts] + [np.array([e.get("ts")], dtype=np.float64)
                     for e in ([found.span] if found.span else [])]
    origin_us = int(math.floor(min((float(a.min()) for a in all_ts if len(a)), default=0.0)))
    start = to_ns(ts, origin_us)
    end = start + np.maximum(np.rint(dur * 1000.0).astype(np.int64), 0)

    names, name_id = intern_values(cols.names)
    tids, thread_index = intern_values(cols.tids)
    memory = _memory_records(found.memory, origin_us, path, tids,
                             trace_events)  # may add threads
    thread_ids = [t if type(t) is int and -2 ** 63 <= t < 2 ** 63 else k
                  for k, t in enumerate(tids)]
    args = cols.args
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
    inputs = _encode_inputs(args, thread_index, len(tids), records)

    stacks: Optional[List[Optional[List[str]]]] = None
    texts = list(map(methodcaller("get", "Call stack"), args))
    if texts.count(None) < len(texts):
        parsed: Dict[str, List[str]] = {}
        stacks = [None if not isinstance(t, str) else
                  parsed.get(t) or parsed.setdefault(t, split_call_stack(t)) for t in texts]

    flops: Optional[np.ndarray] = None
    flop_values = list(map(methodcaller("get", "flops", 0), args))
    if flop_values.count(0) < len(flop_values):
        flops = int_column(flop_values, 0)

    is_python = found.is_python.copy() if found.is_python.any() else None
    order = sort_order(start, end)
    if len(order) and not np.array_equal(order, np.arange(len(order))):
        records = records[order]
        if is_python is not None:
            is_python = is_python[order]
        if stacks is not None:
            stacks = [stacks[i] for i in order.tolist()]
        if flops is not None:
            flops = flops[order]

    start_ns, stop_ns = _window(found.span, start, end, origin_us)
    pids = [e.get("pid") for e in ops[:1]]
    raw = RawSession(
        records=records, inputs=inputs, thread_ids=thread_ids,
        names=[n if isinstance(n, str) else str(n) for n in names],
        start_ns=start_ns, stop_ns=stop_ns, epoch_offset_ns=epoch_offset_ns,
        collector="trace", process_id=pids[0] if pids and type(pids[0]) is int and
        -2 ** 63 <= pids[0] < 2 ** 63 else 0,
        memory=memory)
    options, metadata = _settings(doc)
    return TraceContents(
        raw=raw, stacks=stacks, options=options, metadata=metadata,
        is_python_function=is_python,
        module_args=_module_args(ops, args, user_rows), flops=flops,
        marks=_marks(found.instants, origin_us, path, trace_events),
        thread_names={t: n for t, n in found.thread_names.items() if isinstance(t, int)},
        python_functions=python_functions)


def hashable(value: Any) -> Any:
    """``value`` if it can be a dict key, else its text (a list where an id should be).

    >>> hashable(3), hashable([1])
    (3, '[1]')
    """
    return value if isinstance(value, (str, int, float, type(None))) else str(value)


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


try:  # optional: ~10x faster keys than repr() on traces with many recorded inputs
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


def _settings(doc: Dict[str, Any]):
    """Options (the flag keys) and metadata (other top-level keys, as JSON text)."""
    options = {name: bool(doc.get(name)) for name in OPTION_NAMES}
    metadata: Dict[str, str] = {}
    for key, value in doc.items():
        if key in FORMAT_KEYS or not isinstance(key, str):
            continue
        if key in OPTION_NAMES:
            if options[key]:
                metadata[key] = "1"  # as opscope.profile records it
            continue
        try:
            metadata[key] = json.dumps(value, allow_nan=False)
        except ValueError:
            continue
    return options, metadata


_MEMORY_ARGS = (("addr", "Addr"), ("bytes", "Bytes"), ("total_allocated", "Total Allocated"),
                ("total_reserved", "Total Reserved"), ("device_type", "Device Type"),
                ("device_index", "Device Id"))


def _memory_records(events: List[dict], origin_us: int, path: str,
                    tids: List[Any], trace_events: List[Any]) -> np.ndarray:
    """``[memory]`` instants as allocator records (``MEMORY_DTYPE``), in trace order.

    A thread seen only in memory events is appended to ``tids``.
    """
    out = np.zeros(len(events), dtype=MEMORY_DTYPE)
    if not events:
        return out
    out["time_ns"] = to_ns(float_column([e.get("ts") for e in events], "ts", path, events,
                                        trace_events), origin_us)
    index = {t: i for i, t in enumerate(tids)}
    keys = [hashable(e.get("tid")) for e in events]
    for key in keys:
        if key not in index:
            index[key] = len(tids)
            tids.append(key)
    out["thread_index"] = [index[key] for key in keys]
    args = [e.get("args") if type(e.get("args")) is dict else {} for e in events]
    for column, key in _MEMORY_ARGS:
        default = -1 if column == "device_index" else 0
        values = int_column(list(map(methodcaller("get", key, default), args)), default)
        if column.startswith("device"):
            values = np.clip(values, -128, 127)
        out[column] = values
    return out


def _marks(events: List[dict], origin_us: int, path: str,
           trace_events: List[Any]) -> List[Tuple[int, int, str]]:
    """(ns, OS thread id, message) of each CPU instant event (``opscope.itt.mark``)."""
    if not events:
        return []
    ts = to_ns(float_column([e.get("ts") for e in events], "ts", path, events, trace_events),
               origin_us).tolist()
    return [(t, e.get("tid") if type(e.get("tid")) is int and abs(e.get("tid")) < 2 ** 63
             else 0, str(e.get("name"))) for t, e in zip(ts, events)]


def _module_args(ops: List[dict], args: List[dict],
                 user_rows: np.ndarray) -> Dict[str, Dict[str, Any]]:
    """Args of the ranges that mark an ``nn.Module`` call, by range name."""
    out: Dict[str, Dict[str, Any]] = {}
    for i in user_rows.tolist():
        if "Module Class" in args[i]:
            out.setdefault(str(ops[i].get("name")), args[i])
    return out
