"""A trace's op events gathered into columns, one batch of events at a time.

``trace_stream`` parses ``traceEvents`` in batches and hands each one to
:class:`TraceColumns.add`, which keeps only numpy columns and interned values
of the batch (a hundred-odd bytes an op) and lets the batch's JSON objects go.
``trace_events.columns_session`` turns the gathered columns into the
``RawSession``. A parsed document is one batch, so both readers share this path.

Decisions that need the whole trace are put off to the end: which
``python_function`` events are kept (the rule may rest on a top-level key
written after the events), so values are interned provisionally and renumbered
in first-seen order of the kept events; and the error for a bad ``ts`` or
``dur``, which names the first bad kept event, as reading it whole does.

Example::

    >>> cols = TraceColumns("t.json")
    >>> cols.add([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 3, "ts": 1}], 0)
    >>> cols.add([{"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 3, "ts": 2}], 1)
    >>> [cols.names.values[i] for i in cols.column("name")], cols.column("ts").tolist()
    (['aten::mm', 'aten::add'], [1.0, 2.0])
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import methodcaller
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from opscope.load.trace_device import correlation_column
from opscope.load.lean_events import op_args
from opscope.model.collective_facts import MARKER_ARGS, CollectiveFacts
from opscope.model.modules import TRACE_ARG_FUSED, fused_modules_from_text
from opscope.load.trace_scan import (MAX_MICROSECONDS, ScannedEvents, bad_number,
                                     int_column, is_microseconds, op_columns)
from opscope.model.torch_names import (C10D_PREFIX, COLLECTIVE_RANGE_PREFIXES,
                                       NCCL_KERNEL_PREFIXES, RECORD_PARAM_COMMS)

_INPUT_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
NO_TEXT, NOT_TEXT = -1, -2  # stack codes: no ``Call stack``; one that is not a string
_PYTHON_RULE_EVENTS = 64  # python_function events whose args tell the torch version
_COLLECTIVE_PREFIXES = (C10D_PREFIX,) + COLLECTIVE_RANGE_PREFIXES + NCCL_KERNEL_PREFIXES


try:  # faster keys than repr() on traces with many recorded inputs
    from orjson import dumps as _fast_dumps
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from msgspec.json import encode as _fast_dumps
    except ImportError:
        _fast_dumps = None


def signature_key(values: tuple) -> object:
    """A hashable key equal for equal input lists.

    >>> signature_key(([[2]], ["float"])) == signature_key(([[2]], ["float"]))
    True
    """
    if _fast_dumps is not None:
        try:
            return _fast_dumps(values)
        except (TypeError, ValueError):  # integers beyond 64 bits
            pass
    return repr(values)


class Interned:
    """Values numbered in first-seen order (provisional ids: every event counted).

    >>> names = Interned()
    >>> names.codes(["b", "a", "b"]).tolist(), names.values
    ([0, 1, 0], ['b', 'a'])
    """

    def __init__(self) -> None:
        self.values: List[Any] = []
        self.ids: Dict[Any, int] = {}

    def codes(self, values: List[Any]) -> np.ndarray:
        """int32 id of each value; values that cannot be keys count as their text."""
        ids = self.ids
        try:
            new = [v for v in dict.fromkeys(values) if v not in ids]
        except TypeError:  # an unhashable value (a list where a name should be)
            values = [v if isinstance(v, (str, int, float, type(None))) else str(v)
                      for v in values]
            new = [v for v in dict.fromkeys(values) if v not in ids]
        for v in new:
            ids[v] = len(self.values)
            self.values.append(v)
        return np.fromiter(map(ids.__getitem__, values), dtype=np.int32, count=len(values))

    def id(self, value: Any) -> int:
        """The id of one hashable value."""
        k = self.ids.get(value)
        if k is None:
            k = self.ids[value] = len(self.values)
            self.values.append(value)
        return k


def first_seen(codes: np.ndarray, values: List[Any]) -> Tuple[List[Any], np.ndarray]:
    """(the values ``codes`` use, in first-seen order; ``codes`` renumbered to them).

    Negative codes (none) stay as they are.

    >>> vals, codes = first_seen(np.array([2, -1, 0, 2]), ["a", "b", "c"])
    >>> vals, codes.tolist()
    (['c', 'a'], [0, -1, 1, 0])
    """
    used = codes >= 0
    uniq, first = np.unique(codes[used], return_index=True)
    order = uniq[np.argsort(first, kind="stable")]
    remap = np.full(len(values) + 1, -1, dtype=np.int64)
    remap[order] = np.arange(len(order))
    out = codes.astype(np.int64)
    out[used] = remap[codes[used]]
    return [values[k] for k in order.tolist()], out


class EventPositions:
    """A stand-in for the ``traceEvents`` list, for messages that say where an event is.

    Iterating it yields, at each event's place, the events it was given
    (None elsewhere), as ``trace_scan.event_position`` expects.

    >>> e = {"ts": "x"}
    >>> list(EventPositions([e], [2]))
    [None, None, {'ts': 'x'}]
    """

    def __init__(self, events: List[Any], positions: List[int]) -> None:
        self.at = dict(zip(positions, events))

    def __len__(self) -> int:
        return max(self.at, default=-1) + 1

    def __iter__(self) -> Iterator[Any]:
        return map(self.at.get, range(len(self)))


class TraceColumns:
    """The columns of a trace's op events, added a batch at a time (see the module doc).

    ``add(events, first)`` takes the next batch (``first``: the place of its
    first event in ``traceEvents``); ``column(name)`` is one column over
    every op so far (``ts``, ``dur`` float microseconds, NaN where bad;
    ``name``, ``tid``, ``cat`` ids into ``names``, ``tids``, ``cats``;
    ``seq``, ``fwd``, ``python``, ``sig`` input ids into ``signatures``,
    ``stack`` ids into ``stacks``, ``flops``, ``has_flops``); ``fused`` maps an op
    to its ``"Fused Modules"`` (sparse: a compiled kernel's, see ``model.modules``),
    ``collective_facts`` to its collective's facts (``model.collective_facts``).

    ``lean``: the events come from ``lean_events.lean_loads`` (or parsed whole),
    and only the collectives' args are read (what a rank's facts need): every
    other op has no inputs, stack, FLOPs, sequence number, correlation or module.

    >>> cols = TraceColumns("t.json", lean=True)
    >>> from opscope.load.lean_events import lean_loads
    >>> cols.add(lean_loads('[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, '
    ...     '"args": {"Input Dims": [[2]]}}, {"ph": "X", "cat": "cpu_op", '
    ...     '"name": "c10d::allreduce_", "ts": 2, "args": {"Input Dims": [[4]]}}]'), 0)
    >>> cols.column("sig").tolist(), cols.signature_values[0][0]
    ([-1, 0], [[4]])
    """

    def __init__(self, path: str, lean: bool = False) -> None:
        self.path = path
        self.lean = lean
        self.reset()

    def reset(self) -> None:
        """Forget every event (a later ``traceEvents`` key replaces an earlier one)."""
        self.names, self.tids, self.cats = Interned(), Interned(), Interned()
        self.signatures, self.stacks = Interned(), Interned()  # of keys, of texts
        self.signature_values: Dict[int, tuple] = {}  # signature id -> its four args
        self.batches: Dict[str, List[np.ndarray]] = {}
        self.count = 0  # ops so far
        self.span: Optional[dict] = None
        self.span_seen = False
        self.memory: List[dict] = []
        self.instants: List[dict] = []
        self.device: List[dict] = []  # kernel, gpu_memcpy, gpu_memset events
        self.positions: Tuple[List[int], List[int]] = ([], [])  # of memory, instants
        self.flows_start: Dict[Any, dict] = {}
        self.flows_end: Dict[Any, dict] = {}
        self.thread_names: Dict[Any, str] = {}
        self.python_events: List[dict] = []  # the first few, for the torch version's rule
        self.pids: Dict[bool, Any] = {}  # the first op's pid, and the first non-Python op's
        self.modules: List[Tuple[int, str, dict]] = []  # (op, name, args) of module ranges
        self.fused: Dict[int, Tuple[str, ...]] = {}  # op -> its "Fused Modules" entries
        self.collective_facts: Dict[int, CollectiveFacts] = {}  # op -> its collective's facts
        # (what, is python) -> (op, error) of the first bad ts or dur of each kind of op
        self.bad: Dict[Tuple[str, bool], Tuple[int, Exception]] = {}
        self.has_stacks = False
        self.collective_names: List[bool] = []  # per name id: a collective's (lean)

    def column(self, name: str) -> np.ndarray:
        """One column over every op added so far (a read-only view where every batch
        holds one value: a CPU trace's correlations, inputs and stacks cost nothing)."""
        parts = self.batches.get(name, [])
        if name == "flops" or name == "has_flops":
            return np.concatenate(parts) if parts else np.zeros(self.count, dtype=np.int64)
        if not parts:
            return np.zeros(0)
        if all(p.strides == (0,) for p in parts) and len({p[0] for p in parts if len(p)}) <= 1:
            value = next((p[:1] for p in parts if len(p)), np.zeros(1, parts[0].dtype))
            return np.broadcast_to(value, (sum(len(p) for p in parts),))
        return np.concatenate(parts)

    def _put(self, name: str, values: np.ndarray) -> None:
        self.batches.setdefault(name, []).append(values)

    def add(self, events: List[Any], first: int) -> None:
        """Gather the batch ``events``, the ``traceEvents`` from place ``first`` on."""
        found = ScannedEvents(events)
        place = (np.arange(len(events)) if found.index_of is None else found.index_of) + first
        self._other_events(found, place)
        ops = found.ops
        if not ops:
            return
        op_place = place[found.op_rows]
        is_python = found.is_python
        cols = op_columns(ops, with_args=not self.lean)
        self._put("ts", self._times(cols.ts, "ts", ops, op_place, is_python))
        self._put("dur", self._times(cols.dur, "dur", ops, op_place, is_python))
        self._put("name", self.names.codes(list(cols.names)))
        self._put("tid", self.tids.codes(list(cols.tids)))
        self._put("cat", self.cats.codes(list(cols.cats)))
        self._put("python", is_python.copy())
        if self.lean:
            rows = self._collective_rows()
            parsed = [op_args(ops[i].get("args")) for i in rows]
            self._args_columns([a if type(a) is dict else {} for a in parsed], len(ops), rows)
        else:
            self._args_columns(cols.args, len(ops))
        self._firsts(ops, cols, is_python, self.batches["cat"][-1])
        self.count += len(ops)

    def _args_columns(self, args: List[dict], n: int, rows: Optional[List[int]] = None) -> None:
        """The columns read from the ops' args: ``args`` are those of the batch's ``n``
        ops, or (lean) of its ops ``rows`` only, the others having none."""
        def spread(values: np.ndarray, none: int) -> np.ndarray:
            if rows is None:
                return values
            out = np.full(n, none, dtype=values.dtype)
            out[rows] = values
            return out

        self._put("seq", spread(int_column(list(map(methodcaller("get", "Sequence number", -1),
                                                    args)), -1), -1))
        self._put("fwd", spread(int_column(list(map(methodcaller("get", "Fwd thread id", 0),
                                                    args)), 0), 0))
        self._put("corr", spread(correlation_column(args), 0))
        self._put("sig", spread(self._signatures(args), -1))
        self._put("stack", spread(self._stack_codes(args), NO_TEXT))
        places = range(n) if rows is None else rows
        flops = list(map(methodcaller("get", "flops", 0), args))
        if rows is not None:
            flops, some = [0] * n, flops
            for i, value in zip(rows, some):
                flops[i] = value
        self._flops(flops)
        self._fused(args, places)
        self._collective_facts(args, places)

    def _collective_rows(self) -> List[int]:
        """The rows of the batch's collectives (and ``record_param_comms``), by name."""
        names = self.names.values
        self.collective_names += [isinstance(n, str) and (n.startswith(_COLLECTIVE_PREFIXES)
                                                          or n == RECORD_PARAM_COMMS)
                                  for n in names[len(self.collective_names):]]
        wanted = np.flatnonzero(self.collective_names)
        return np.flatnonzero(np.isin(self.batches["name"][-1], wanted)).tolist()

    def _other_events(self, found: ScannedEvents, place: np.ndarray) -> None:
        if not self.span_seen and found.span_seen:
            self.span_seen, self.span = True, found.span
        self.memory += found.memory
        self.device += found.device
        self.positions[0].extend(place[found.memory_rows].tolist())
        self.instants += found.instants
        self.positions[1].extend(place[found.instant_rows].tolist())
        self.flows_start.update(found.flows_start)
        self.flows_end.update(found.flows_end)
        self.thread_names.update(found.thread_names)

    def _times(self, values: List[Any], what: str, ops: List[dict], op_place: np.ndarray,
               is_python: np.ndarray) -> np.ndarray:
        """Float microseconds, NaN where a value is not a usable time (its error kept)."""
        if not set(map(type, values)) - {int, float}:
            try:
                out = np.array(values, dtype=np.float64)
                if (np.abs(out) <= MAX_MICROSECONDS).all():
                    return out
            except OverflowError:
                pass
        ok = np.fromiter(map(is_microseconds, values), dtype=bool, count=len(values))
        out = np.array([v if k else np.nan for v, k in zip(values, ok.tolist())],
                       dtype=np.float64)
        for python in (False, True):
            rows = np.flatnonzero(~ok & (is_python == python))
            if len(rows) and (what, python) not in self.bad:
                i = int(rows[0])
                self.bad[(what, python)] = (self.count + i, bad_number(
                    self.path, f"traceEvents[{int(op_place[i])}]", what, values[i], ops[i]))
        return out

    def _signatures(self, args: List[dict]) -> np.ndarray:
        """Per op the id of its recorded inputs in ``signatures`` (-1: none)."""
        out = np.full(len(args), -1, dtype=np.int32)
        has = np.fromiter(map(dict.__contains__, args, repeat("Input Dims")), bool, len(args))
        has |= np.fromiter(map(dict.__contains__, args, repeat("Input type")), bool,
                           len(args))
        rows = np.flatnonzero(has)
        if not len(rows):
            return out
        some = [args[i] for i in rows.tolist()]
        values = list(zip(*(map(methodcaller("get", k), some) for k in _INPUT_KEYS)))
        try:
            keys = list(map(_fast_dumps, values)) if _fast_dumps is not None else None
        except (TypeError, ValueError):  # integers beyond 64 bits
            keys = None
        if keys is None:
            keys = list(map(signature_key, values))
        known = len(self.signatures.values)
        codes = self.signatures.codes(keys)
        new = np.flatnonzero(codes >= known)
        for k, i in zip(*np.unique(codes[new], return_index=True)):
            self.signature_values[int(k)] = values[int(new[i])]
        out[rows] = codes
        return out

    def _stack_codes(self, args: List[dict]) -> np.ndarray:
        texts = list(map(methodcaller("get", "Call stack"), args))
        if texts.count(None) == len(texts):
            return np.full(len(texts), NO_TEXT, dtype=np.int32)
        self.has_stacks = True
        return np.array([NO_TEXT if t is None else self.stacks.id(t) if isinstance(t, str)
                         else NOT_TEXT for t in texts], dtype=np.int32)

    def _flops(self, values: List[Any]) -> None:
        """The ops' ``flops`` args (0: none); a column only once some op has them."""
        if values.count(0) == len(values) and "flops" not in self.batches:
            return
        if "flops" not in self.batches:  # the first batch with FLOPs: zeros before it
            self._put("flops", np.zeros(self.count, dtype=np.int64))
            self._put("has_flops", np.zeros(self.count, dtype=bool))
        self._put("flops", int_column(values, 0))
        self._put("has_flops", np.array([v != 0 for v in values], dtype=bool))

    def _fused(self, args: List[dict], places: Sequence[int]) -> None:
        """The ops' "Fused Modules" (``args[k]`` is op ``places[k]``'s)."""
        for i in compress(range(len(args)), map(dict.__contains__, args, repeat(TRACE_ARG_FUSED))):
            entries = fused_modules_from_text(args[i][TRACE_ARG_FUSED])
            if entries:
                self.fused[self.count + places[i]] = entries

    def _collective_facts(self, args: List[dict], places: Sequence[int]) -> None:
        """The ops' collective facts (``args[k]`` is op ``places[k]``'s)."""
        for key in MARKER_ARGS:
            for i in compress(range(len(args)), map(dict.__contains__, args, repeat(key))):
                op = self.count + places[i]
                if op not in self.collective_facts:
                    facts = CollectiveFacts.from_args(args[i])
                    if facts is not None:
                        self.collective_facts[op] = facts

    def _firsts(self, ops: List[dict], cols, is_python: np.ndarray, cats: np.ndarray) -> None:
        """The first pids, the first Python events and the module ranges of the batch."""
        if True not in self.pids:
            self.pids[True] = ops[0].get("pid")
        plain = np.flatnonzero(~is_python)
        if False not in self.pids and len(plain):
            self.pids[False] = ops[int(plain[0])].get("pid")
        if len(self.python_events) < _PYTHON_RULE_EVENTS and is_python.any():
            rows = np.flatnonzero(is_python)[:_PYTHON_RULE_EVENTS].tolist()
            self.python_events += [dict(ops[i], args=op_args(ops[i]["args"]))
                                   if "args" in ops[i] else ops[i] for i in rows]
            del self.python_events[_PYTHON_RULE_EVENTS:]
        user = self.cats.ids.get("user_annotation")
        for i in np.flatnonzero(cats == user).tolist() if user is not None else ():
            if "Module Class" in cols.args[i]:
                self.modules.append((self.count + i, str(cols.names[i]), cols.args[i]))
