"""One pass over a parsed trace's events: sort them by kind, pull their fields into columns.

The loader's hot path for large traces: fields are read with ``map`` and
``itemgetter`` (C speed, one visit per event dict), kinds are told apart with
numpy over interned ``ph``/``cat`` values, and only the few events that are
neither ops nor ranges (flows, instants, metadata) are looked at one by one.

Example::

    >>> found = ScannedEvents([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.5},
    ...                        {"ph": "M", "name": "thread_name", "tid": 3,
    ...                         "args": {"name": "main"}}])
    >>> [e["name"] for e in found.ops], found.thread_names
    (['aten::mm'], {3: 'main'})
    >>> to_ns(np.array([1.5, 2.001]), 1).tolist()
    [1500, 2001]
"""

from __future__ import annotations

from operator import itemgetter, methodcaller
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from opscope.load.lean_events import op_args
from opscope.model.torch_names import MEMORY_EVENT
from opscope.model.records import SCOPE_FUNCTION, SCOPE_USER
from opscope.load.trace_file import TraceLoadError

# The largest |time| in microseconds: its nanoseconds, doubled, still fit in int64.
MAX_MICROSECONDS = 4e15

# Event categories that are host-side ops and ranges, and their RecordFunction scope.
OP_CATEGORIES = {
    "cpu_op": SCOPE_FUNCTION, "operator": SCOPE_FUNCTION,
    "user_annotation": SCOPE_USER,
    "cuda_runtime": SCOPE_FUNCTION, "cuda_driver": SCOPE_FUNCTION, "runtime": SCOPE_FUNCTION,
}


def to_ns(ts: np.ndarray, origin_us: int) -> np.ndarray:
    """Microsecond floats -> integer ns, exact to the ns for the trace's 3 decimals.

    Subtracting a whole-microsecond origin first keeps the product small, so
    large absolute timestamps (Kineto's) still round to the right nanosecond.
    """
    return np.rint((ts - origin_us) * 1000.0).astype(np.int64) + origin_us * 1000


def event_position(event: Any, trace_events: Optional[Sequence[Any]]) -> str:
    """``traceEvents[12]``: where ``event`` is in the trace (searched only for an error)."""
    for i, e in enumerate(trace_events or ()):
        if e is event:
            return f"traceEvents[{i}]"
    return "traceEvents[?]"


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages.

    >>> type_name("a"), type_name(None), type_name([1]), type_name(True)
    ('string', 'null', 'array', 'boolean')
    """
    if isinstance(value, bool):
        return "boolean"
    return {str: "string", type(None): "null", list: "array", dict: "object",
            int: "integer", float: "number"}.get(type(value), type(value).__name__)


def float_column(values: Sequence[Any], what: str, path: str, events: Sequence[dict],
                 trace_events: Optional[Sequence[Any]] = None) -> np.ndarray:
    """``values`` (the field ``what`` of each of ``events``) as float64 microseconds.

    A missing, non-numeric, non-finite or out-of-range value (beyond
    +-``MAX_MICROSECONDS``, where nanoseconds would pass 64 bits) raises
    :class:`TraceLoadError` naming the file, the event's place in
    ``trace_events`` and the field.

    >>> float_column([1, 2.5], "ts", "t.json", [{}, {}]).tolist()
    [1.0, 2.5]
    >>> events = [{"ts": 1}, {"name": "mm", "ts": "soon"}]
    >>> float_column(["soon"], "ts", "t.json", events[1:], events)
    Traceback (most recent call last):
    ...
    opscope.load.trace_file.TraceLoadError: trace 't.json': traceEvents[1].ts (event 'mm'): expected a number of microseconds, got string 'soon'
    """
    out = None
    if not set(map(type, values)) - {int, float}:  # numpy would also take "5" and True
        try:
            out = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer past a float's range
            pass
    if out is None or (len(out) and not (np.abs(out) <= MAX_MICROSECONDS).all()):
        bad = next(i for i, v in enumerate(values) if not is_microseconds(v))
        raise bad_number(path, event_position(events[bad], trace_events), what, values[bad],
                         events[bad])
    return out


def is_microseconds(value: Any) -> bool:
    """Whether ``value`` is a usable time: a JSON number within +-``MAX_MICROSECONDS``.

    >>> is_microseconds(1.5), is_microseconds(True), is_microseconds(1e300)
    (True, False, False)
    """
    return type(value) in (int, float) and abs(value) <= MAX_MICROSECONDS


def bad_number(path: str, position: str, what: str, value: Any, event: Any) -> TraceLoadError:
    """The error for ``event``'s field ``what`` that is not a usable time (see float_column)."""
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    problem = "out of range" if isinstance(value, (int, float)) and \
        not isinstance(value, bool) else type_name(value)
    name = event.get("name") if isinstance(event, dict) else None
    of = f" (event {name[:60]!r})" if isinstance(name, str) else ""
    return TraceLoadError(path, f"{position}.{what}{of}: expected a number of microseconds, "
                                f"got {problem} {shown}")


def int_column(values: Sequence[Any], default: int) -> np.ndarray:
    """``values`` as int64, ``default`` where one is not a 64-bit integer.

    Each value is judged alone (a float, a boolean or a numeric string is not
    an integer), so a column read in batches is the column read whole.

    >>> int_column([3, None, True, 2 ** 70, 2.0], -1).tolist()
    [3, -1, -1, -1, -1]
    """
    if not set(map(type, values)) - {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    return np.array([v if type(v) is int and -2 ** 63 <= v < 2 ** 63 else default
                     for v in values], dtype=np.int64)


def hashable(value: Any) -> Any:
    """``value`` if it can be a dict key, else its text (a list where an id should be).

    >>> hashable(3), hashable([1])
    (3, '[1]')
    """
    return value if isinstance(value, (str, int, float, type(None))) else str(value)


class OpColumns(NamedTuple):
    """The fields of the op events, one sequence each, in event order."""

    ts: list
    dur: list
    names: list
    tids: list
    cats: list
    args: List[dict]


_OP_KEYS = ("ts", "dur", "name", "tid", "cat", "args")
_OP_FIELDS = itemgetter(*_OP_KEYS)
_OP_FIELDS_NO_ARGS = itemgetter(*_OP_KEYS[:-1])
_EMPTY: Dict[str, Any] = {}


def op_columns(ops: List[dict], with_args: bool = True) -> OpColumns:
    """The fields the loader reads, one list each (C-speed when every event has them).

    Without ``with_args``, every op's args are empty (a lean load reads its own).
    """
    if not ops:
        return OpColumns([], [], [], [], [], [])
    keys = _OP_KEYS if with_args else _OP_KEYS[:-1]
    try:  # one pass over each event's dict: its fields are read while it is in cache
        columns = list(zip(*map(_OP_FIELDS if with_args else _OP_FIELDS_NO_ARGS, ops)))
    except KeyError:  # some event lacks a field: one forgiving pass per field
        columns = [list(map(methodcaller("get", key), ops)) for key in keys]
    ts, dur, names, tids, cats = columns[:5]
    args = columns[5] if with_args else [_EMPTY] * len(ops)
    if None in dur:
        dur = [0 if d is None else d for d in dur]
    if set(map(type, args)) - {dict}:
        args = [a if type(a) is dict else _EMPTY for a in args]
    return OpColumns(ts, dur, names, tids, cats, args)


def intern_values(values: list):
    """(distinct values in first-seen order, int32 index of each value).

    >>> intern_values(["b", "a", "b"])
    (['b', 'a'], array([0, 1, 0], dtype=int32))
    """
    try:
        distinct = list(dict.fromkeys(values))
    except TypeError:  # an unhashable value (a list where a name should be): use its text
        values = [v if isinstance(v, (str, int, float, type(None))) else str(v) for v in values]
        distinct = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(distinct)}
    return distinct, np.fromiter(map(index.__getitem__, values), dtype=np.int32,
                                 count=len(values))


_GET_PH = methodcaller("get", "ph")
_GET_CAT = methodcaller("get", "cat")
# what an X event's category makes it
_OP, _PYTHON, _SPAN, _DEVICE = 1, 2, 3, 4


def is_op_category(cat: Any) -> bool:
    """Whether an ``X`` event of category ``cat`` is an op (any letter case).

    >>> is_op_category("cpu_op"), is_op_category("CPU_OP"), is_op_category("kernel")
    (True, True, False)
    """
    return cat in OP_CATEGORIES or (isinstance(cat, str) and cat.lower() in OP_CATEGORIES)


def _category_kind(cat: Any) -> int:
    if is_op_category(cat):
        return _OP
    return {"python_function": _PYTHON, "Trace": _SPAN, "kernel": _DEVICE,
            "gpu_memcpy": _DEVICE, "gpu_memset": _DEVICE}.get(cat, 0) \
        if isinstance(cat, str) else 0


def _valid_span(event: dict) -> bool:
    """Whether a window event's ``ts`` and ``dur`` are usable numbers (else it is ignored)."""
    return all(type(v) in (int, float) and abs(v) <= MAX_MICROSECONDS
               for v in (event.get("ts"), event.get("dur", 0)))


def _args_parsed(event: dict) -> dict:
    """``event`` with its args parsed, where a lean load left them raw (``lean_events``)."""
    args = event.get("args")
    if args is not None and type(args) is not dict:
        parsed = op_args(args)
        if parsed is not args:
            event["args"] = parsed
    return event


class ScannedEvents:
    """The trace's events sorted into the kinds the loader uses.

    Columns of ``ph`` and ``cat`` are classified with numpy; only the few
    events that are neither ops nor ranges (flows, instants, metadata) are
    looked at one by one.
    """

    def __init__(self, events: List[Any]):
        self.memory: List[dict] = []
        self.instants: List[dict] = []
        self.flows_start: Dict[Any, dict] = {}
        self.flows_end: Dict[Any, dict] = {}
        self.span: Optional[dict] = None  # the window event, when its ts/dur are valid
        self.thread_names: Dict[Any, str] = {}
        self.span_seen = False  # a window event was seen (valid or not)
        # the rows below count the objects among the events; index_of[row] is the
        # event's place in the list given (None: every event is an object)
        self.index_of: Optional[np.ndarray] = None
        self.memory_rows: List[int] = []  # where the memory and instant events are
        self.instant_rows: List[int] = []
        try:
            phs = list(map(_GET_PH, events))
            cats = list(map(_GET_CAT, events))
        except AttributeError:  # an event that is not an object: skip those
            self.index_of = np.array([i for i, e in enumerate(events) if type(e) is dict],
                                     dtype=np.int64)
            events = [events[i] for i in self.index_of.tolist()]
            phs = list(map(_GET_PH, events))
            cats = list(map(_GET_CAT, events))
        ph_names, ph_id = intern_values(phs)
        cat_names, cat_id = intern_values(cats)
        kind = np.array([_category_kind(c) for c in cat_names] + [0], dtype=np.int8)[cat_id]
        is_x = ph_id == (ph_names.index("X") if "X" in ph_names else -1)
        kind = np.where(is_x, kind, 0)
        rows = np.flatnonzero((kind == _OP) | (kind == _PYTHON))
        self.op_rows = rows  # where each op is in ``events``
        self.ops: List[dict] = [events[i] for i in rows.tolist()]
        self.is_python = kind[rows] == _PYTHON
        # kernels, copies, memsets (load/trace_device.py reads them)
        self.device: List[dict] = [_args_parsed(events[i])
                                   for i in np.flatnonzero(kind == _DEVICE).tolist()]
        spans = np.flatnonzero(kind == _SPAN)
        self.span_seen = bool(len(spans))
        if len(spans) and _valid_span(events[int(spans[0])]):
            self.span = events[int(spans[0])]
        other = [ph_names.index(p) for p in ("i", "I", "s", "f", "M") if p in ph_names]
        for i in np.flatnonzero(np.isin(ph_id, other)).tolist():
            self._other(events[i], i)

    def python_functions(self) -> List[dict]:
        """The ``python_function`` events among ``ops``."""
        return [self.ops[i] for i in np.flatnonzero(self.is_python).tolist()]

    def drop_python_functions(self) -> None:
        """Forget the ``python_function`` events: they will not become records."""
        keep = np.flatnonzero(~self.is_python).tolist()
        self.ops = [self.ops[i] for i in keep]
        self.is_python = np.zeros(len(self.ops), dtype=bool)

    def _other(self, e: dict, row: int) -> None:
        e = _args_parsed(e)
        ph = e.get("ph")
        if ph in ("i", "I"):
            if e.get("name") == MEMORY_EVENT:
                self.memory.append(e)
                self.memory_rows.append(row)
            elif e.get("cat") == "cpu_instant_event":
                self.instants.append(e)
                self.instant_rows.append(row)
        elif ph in ("s", "f"):
            if e.get("cat") == "fwdbwd" and isinstance(e.get("id"), (int, str)):
                (self.flows_start if ph == "s" else self.flows_end)[e.get("id")] = e
        elif e.get("name") == "thread_name" and type(e.get("tid")) is int:
            args = e.get("args")
            name = args.get("name") if isinstance(args, dict) else None
            if isinstance(name, str):
                self.thread_names[e.get("tid")] = name
