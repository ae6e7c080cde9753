"""One session as the store's tables: pyarrow tables in ``opscope.store.schema``'s layout.

``window_tables(session, shift_ns)`` gives the events, inputs, stacks, memory
and device tables of one window, ``sessions_table`` its sessions row (which
records the footers of the others once written); ``shift_ns`` (the session's
``epoch_offset_ns`` plus the rank's clock offset) turns session-clock times
into aligned Unix ns. The derived per-event facts (step, module, depth, input
signature, stack) come from ``opscope.analysis``, computed as every exporter
computes them.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import NO_INPUTS, SCOPE_USER, RawSession, records_from_rows
    >>> rows = [(0, 100, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
    ...         (10, 60, -1, 1, 0, 0, 1, NO_INPUTS, 0, 0, 0)]
    >>> s = build_session(RawSession(records_from_rows(rows), [], [7],
    ...                              ["ProfilerStep#3", "aten::mm"], 0, 100, 1000))
    >>> t = window_tables(s, 1000)
    >>> t["events"].column("name").to_pylist(), t["events"].column("step").to_pylist()
    (['ProfilerStep#3', 'aten::mm'], [3, 3])
    >>> t["events"].column("start_ns").to_pylist(), t["events"].column("parent").to_pylist()
    ([1000, 1010], [-1, 0])
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np

from opscope.model.arrays import distinct
from opscope.analysis.ancestry import event_depth
from opscope.analysis.device import session_correlations
from opscope.analysis.facts import event_modules, event_steps, step_ranges
from opscope.files.background import Background
from opscope.model.memory import CATEGORY_NAMES, UNKNOWN
from opscope.model.session import OPTION_NAMES, ProfileSession
from opscope.model.torch_names import PROFILER_STEP_PREFIX
from opscope.store.extras import session_extras
from opscope.store.arrow_arrays import arrow_array, plain_array
from opscope.store.schema import COLUMNS, arrow_schema, require_pyarrow

_MEMORY_USAGE = ("cpu_memory_usage", "self_cpu_memory_usage", "device_memory_usage",
                 "self_device_memory_usage")
# the RankFacts fields a sessions row keeps (per window)
RANK_FACT_FIELDS = ("steps", "step_ns", "compute_ns", "comm_ns", "overlap_ns", "start_ns",
                    "end_ns", "group", "group_ranks")


def arrow_table(table: str, columns: Dict[str, Any]):
    """A pyarrow table of ``table``'s schema from ``columns`` (name -> values)."""
    pa, _ = require_pyarrow()
    schema = arrow_schema(table)
    arrays = []
    for field in schema:
        values = columns[field.name]
        if isinstance(values, pa.Array):
            arrays.append(values if values.type == field.type else values.cast(field.type))
        elif pa.types.is_dictionary(field.type):
            arrays.append(arrow_array(values, pa.string()).dictionary_encode())
        else:
            arrays.append(arrow_array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


@lru_cache(maxsize=4)
def _nulls(n: int):
    """``n`` null int64 values (a column that was not recorded); arrays are immutable,
    so every batch of one size shares one."""
    pa, _ = require_pyarrow()
    return pa.nulls(n, pa.int64())


def _masked(values: np.ndarray, present: np.ndarray, kind: str = "int64"):
    """Integers (``kind``: a pyarrow type name), null where not ``present``.

    The validity bitmap is packed by numpy: ``pa.array(..., mask=)`` takes about a
    microsecond a value.

    >>> _masked(np.array([5, 6, 7]), np.array([True, False, True])).to_pylist()
    [5, None, 7]
    """
    pa, _ = require_pyarrow()
    return plain_array(getattr(pa, kind)(), np.ascontiguousarray(values, dtype=kind),
                       np.asarray(present, dtype=bool))


def _dictionary(codes: np.ndarray, names: List[Optional[str]],
                used: Optional[np.ndarray] = None):
    """A dictionary-encoded string array: ``names[code]``, null where code < 0.

    ``used``: the codes the dictionary holds (default: those in ``codes``), so that
    every batch of one column has the same dictionary."""
    pa, _ = require_pyarrow()
    codes = np.asarray(codes, dtype=np.int64)
    if used is None:
        used = _used_codes(codes, len(names))
    index = np.full(len(names) + 1, -1, dtype=np.int32)  # code -> position; [-1]: null
    index[used] = np.arange(len(used), dtype=np.int32)
    position = index[codes]
    present = position >= 0
    dictionary = arrow_array([names[int(c)] for c in used.tolist()], pa.string())
    indices = _masked(np.where(present, position, 0), present, "int32")
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _used_codes(codes: np.ndarray, n_names: int) -> np.ndarray:
    """The codes (0 to ``n_names`` - 1) that occur in ``codes``, ascending; -1 is left out.

    >>> _used_codes(np.array([3, -1, 0, 3], dtype=np.int32), 5).tolist()
    [0, 3]
    """
    seen = np.zeros(n_names + 1, dtype=bool)
    seen[codes] = True  # -1 marks the last slot, past the names
    return np.flatnonzero(seen[:n_names])


def step_numbers(session: ProfileSession) -> np.ndarray:
    """Per event, the N of the ``ProfilerStep#N`` it ran in (its step index when N is
    not a number); -1: none."""
    rows = step_ranges(session)
    if len(rows) == 0:
        return np.full(len(session.table), -1, dtype=np.int64)
    numbers = []
    for i, row in enumerate(rows.tolist()):
        tail = session.table.name(row)[len(PROFILER_STEP_PREFIX):]
        numbers.append(int(tail) if tail.isdigit() else i)
    index = event_steps(session)
    return np.where(index >= 0, np.append(np.array(numbers, dtype=np.int64), -1)[index], -1)


def _stack_ids(session: ProfileSession):
    """(stack id per event, frames per id): each distinct stack once."""
    ids: Dict[tuple, int] = {}
    out = np.full(len(session.table), -1, dtype=np.int32)
    for i, frames in enumerate(session.stacks or ()):
        if frames is not None:
            out[i] = ids.setdefault(tuple(frames), len(ids))
    return out, [list(f) for f in ids]


# Rows of the events table built at a time: its columns (about 200 bytes a row) stay
# this size however long the session, as the writer streams each batch to the file.
EVENTS_BATCH = 1 << 18
# From this many events, a window's events are two files, encoded at the same time (the
# encoding is most of a store's write time; at 10M events, 3.3 s of CPU).
SPLIT_EVENTS = 1 << 20


def events_files(session: ProfileSession, shift_ns: int,
                 stack_id: np.ndarray) -> List[Iterator[Any]]:
    """The ``events`` table of ``session`` as the tables of its files, in row order: one
    file, or two (its halves, cut between batches) from ``SPLIT_EVENTS`` events. Each file's
    tables have ``EVENTS_BATCH`` rows (one, empty, for no events), each made when the one
    before has been taken."""
    facts = _event_facts(session)

    def columns(start: int, end: int) -> Dict[str, Any]:
        return events_columns(session, shift_ns, stack_id, facts, start, end)

    return [_batches("events", columns, lo, hi) for lo, hi in _file_spans(len(session.table))]


def _file_spans(n: int) -> List[tuple]:
    """The rows (lo, hi) of each file of a table of ``n`` rows: one file, or from
    ``SPLIT_EVENTS`` rows two, cut between batches of ``EVENTS_BATCH``."""
    batches = -(-n // EVENTS_BATCH)
    cut = (batches + 1) // 2 * EVENTS_BATCH if n >= SPLIT_EVENTS else n
    return [(0, cut), (cut, n)] if 0 < cut < n else [(0, n)]


def row_files(table: str, columns: Dict[str, Any]) -> List[Iterator[Any]]:
    """``columns`` (name -> the rows' values: numpy or pyarrow arrays, or lists) as the
    tables of ``table``'s files, as ``events_files`` cuts them (the allocator records of a
    long ``profile_memory`` window are millions)."""
    n = len(next(iter(columns.values()))) if columns else 0
    return [_batches(table, _slicer(columns), lo, hi) for lo, hi in _file_spans(n)]


def _slicer(columns: Dict[str, Any]) -> Callable[[int, int], Dict[str, Any]]:
    """The rows ``start`` to ``end`` of ``columns``, as a function of the two."""
    return lambda start, end: {name: values[start:end] for name, values in columns.items()}


def _batches(table: str, columns: Callable[[int, int], Dict[str, Any]], lo: int,
             hi: int) -> Iterator[Any]:
    """``table``'s rows ``lo`` to ``hi`` as pyarrow tables of ``EVENTS_BATCH`` rows (one,
    empty, for none), each made from ``columns(start, end)`` when the one before is taken."""
    for start in range(lo, max(hi, lo + 1), EVENTS_BATCH):
        yield arrow_table(table, columns(start, min(hi, start + EVENTS_BATCH)))


def _event_facts(session: ProfileSession) -> Dict[str, Any]:
    """What events_columns derives per event from the whole session, computed once."""
    t = session.table
    module_row = event_modules(session)
    # 4 bytes an event where the schema's column is int32 (held for the whole write)
    module_code = np.full(len(t), -1, dtype=np.int32)
    inside = np.flatnonzero(module_row >= 0)
    module_code[inside] = t.name_id[module_row[inside]]
    names = len(t.symbols.names)
    return {"module_code": module_code,
            "depth": event_depth(t.parent).astype(np.int32),
            "step": step_numbers(session).astype(np.int32), "input_id": t.input_signatures()[0],
            "correlation": session_correlations(session),
            "used_names": _used_codes(t.name_id, names),
            "used_modules": _used_codes(module_code, names)}


def events_columns(session: ProfileSession, shift_ns: int, stack_id: np.ndarray,
                   facts: Optional[Dict[str, Any]] = None, lo: int = 0,
                   hi: Optional[int] = None) -> Dict[str, Any]:
    """The ``events`` columns of ``session``'s rows ``lo`` to ``hi`` (default: all);
    ``facts``: ``_event_facts(session)``, computed here when not given."""
    t = session.table
    facts = _event_facts(session) if facts is None else facts
    hi = len(t) if hi is None else hi
    n = hi - lo
    part = slice(lo, hi)
    names = t.symbols.names
    tid_of = np.asarray(t.thread_ids, dtype=np.int64)
    memory = session.event_memory or {}
    start, end = t.start_ns[part], t.end_ns[part]
    cols: Dict[str, Any] = {
        "event_id": np.arange(lo, hi, dtype=np.int64), "record": t.record[part],
        "name": _dictionary(t.name_id[part].astype(np.int64), names, facts["used_names"]),
        "thread_id": tid_of[t.thread_index[part]] if len(tid_of) else np.zeros(n, np.int64),
        "thread_index": t.thread_index[part],
        "start_ns": start + shift_ns, "end_ns": end + shift_ns,
        "dur_ns": end - start, "self_ns": t.self_ns[part], "parent": t.parent[part],
        "depth": facts["depth"][part], "seq_nr": t.seq_nr[part],
        "fwd_thread_id": t.fwd_thread_id[part].astype(np.int64),
        "rf_thread_id": t.rf_thread_id[part].astype(np.int64),
        "scope": t.scope[part].astype(np.int8), "flags": t.flags[part].astype(np.int8),
        "step": facts["step"][part],
        "module": _dictionary(facts["module_code"][part].astype(np.int64), names,
                              facts["used_modules"]),
        "input_id": facts["input_id"][part], "stack_id": stack_id[part],
        "flops": session.flops[part] if session.flops is not None else _nulls(n),
    }
    for name in _MEMORY_USAGE:
        cols[name] = memory[name][part] if name in memory else _nulls(n)
    correlation = facts["correlation"]
    cols["correlation"] = _nulls(n) if correlation is None else \
        _masked(correlation[part], correlation[part] > 0)
    return cols


def inputs_columns(session: ProfileSession) -> Dict[str, Any]:
    """The ``inputs`` columns: each distinct signature's words and its decoding as text."""
    t = session.table
    sig, decoded = t.input_signatures()
    words: List[List[int]] = [[] for _ in decoded]
    has = sig >= 0
    offsets: Dict[int, np.ndarray] = {}  # per thread: its rows' input offsets, sorted
    for thread in distinct(t.thread_index[has]).tolist():
        offsets[thread] = distinct(t.input_offset[has & (t.thread_index == thread)])
    rows = np.flatnonzero(has)  # (only those: a window without inputs sorts nothing)
    ids, first = np.unique(sig[rows], return_index=True)
    for k, row in zip(ids.tolist(), rows[first].tolist()):
        thread = int(t.thread_index[row])
        blob, mine = t.raw.inputs[thread], offsets[thread]
        start = int(t.input_offset[row])
        after = int(np.searchsorted(mine, start, side="right"))
        end = int(mine[after]) if after < len(mine) else len(blob)
        words[k] = blob[start:end].tolist()
    return {"input_id": list(range(len(decoded))), "words": words,
            "input_dims": [str(d.shapes) for d in decoded],
            "input_types": [str(d.types) for d in decoded],
            "input_strides": [str(d.strides) for d in decoded],
            "concrete_inputs": [str(d.concrete) for d in decoded]}


def memory_columns(session: ProfileSession, shift_ns: int) -> Dict[str, Any]:
    """The ``memory`` columns: allocator records, their owner event and category."""
    from opscope.analysis.memory_timeline import categorized_blocks

    memory = session.memory
    if memory is None or not len(memory):
        return {name: [] for name, _ in COLUMNS["memory"]}
    category = np.full(len(memory), UNKNOWN, dtype=np.int64)
    blocks = categorized_blocks(session)
    for records in (blocks.alloc_record, blocks.free_record):
        ok = records >= 0
        category[records[ok]] = blocks.category[ok]
    names: List[Optional[str]] = list(CATEGORY_NAMES)
    names[UNKNOWN] = None
    cols: Dict[str, Any] = {name: memory[name] for name, _ in COLUMNS["memory"][:8]}
    cols["time_ns"] = memory["time_ns"] + shift_ns
    cols["event_id"] = np.asarray(session.memory_owner, dtype=np.int64)
    cols["category"] = _dictionary(np.where(category == UNKNOWN, -1, category), names)
    return cols


def device_columns(session: ProfileSession, shift_ns: int) -> Dict[str, Any]:
    """The ``device`` columns: kernels, copies and memsets with their launch and op events."""
    from opscope.model.device import CATEGORIES

    device = session.device
    if device is None or not len(device):
        return {name: [] for name, _ in COLUMNS["device"]}
    rec = device.records
    kinds = sorted(CATEGORIES)
    names = list(dict.fromkeys(device.names))
    code = {n: i for i, n in enumerate(names)}
    return {
        "device_event_id": np.arange(len(rec), dtype=np.int64),
        "category": _dictionary(np.searchsorted(kinds, rec["kind"]).astype(np.int64),
                                [CATEGORIES[k] for k in kinds]),
        "name": _dictionary(np.array([code[n] for n in device.names], dtype=np.int64), names),
        "device": rec["device"], "stream": rec["stream"].astype(np.int64),
        "start_ns": rec["start_ns"] + shift_ns, "end_ns": rec["end_ns"] + shift_ns,
        "dur_ns": device.duration_ns, "correlation": rec["correlation"].astype(np.int64),
        "bytes": rec["bytes"], "launch_event": device.launch_row, "op_event": device.owner_row,
        "registers": rec["registers"].astype(np.int32),
        "shared_memory": rec["shared_static"].astype(np.int64) + rec["shared_dynamic"],
        "context": rec["context"].astype(np.int64), "grid": rec["grid"].tolist(),
        "block": rec["block"].tolist(),
    }


def session_row(session: ProfileSession, shift_ns: int, *, window_name: str,
                clock_offset_ns: int, rank_facts: Any,
                parts: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The one ``sessions`` row of a window; ``parts``: the footers of its files, written
    already (table -> ``folder.Footer``), recorded in its ``extras``."""
    facts = None
    world = None
    if rank_facts is not None:
        facts = json.dumps({k: getattr(rank_facts, k) for k in RANK_FACT_FIELDS})
        world = rank_facts.world_size
    options = {k: bool(session.options.get(k, False)) for k in OPTION_NAMES}
    row = {
        "window_name": window_name, "source_path": session.source_path,
        "process_id": session.process_id, "start_ns": session.start_ns + shift_ns,
        "stop_ns": session.stop_ns + shift_ns, "epoch_offset_ns": session.epoch_offset_ns,
        "clock_offset_ns": clock_offset_ns, "collector": session.collector,
        "trace_name": session.trace_name, "python_functions": session.python_functions,
        "options": json.dumps(options), "metadata": json.dumps(session.metadata),
        "extras": session_extras(session, parts), "world_size": world, "rank_facts": facts,
    }
    return {k: [v] for k, v in row.items()}


def window_tables(session: ProfileSession, shift_ns: int) -> Dict[str, Any]:
    """The pyarrow tables of one window's files but its ``sessions`` row (which records
    their footers once they are written: :func:`sessions_table`): table name -> table."""
    pa, _ = require_pyarrow()
    return {name: pa.concat_tables([t for tables in files for t in tables])
            for name, files in window_parts(session, shift_ns).items()}


def window_parts(session: ProfileSession, shift_ns: int) -> Dict[str, List[Iterable[Any]]]:
    """``window_tables`` as table name -> its files, each the pyarrow tables to write into
    it one after the other, in row order: the events a batch at a time, in one or two
    files (``events_files``)."""
    stack_id, frames = _stack_ids(session)
    return {
        "events": events_files(session, shift_ns, stack_id),
        "inputs": [[arrow_table("inputs", inputs_columns(session))]],
        "stacks": [[arrow_table("stacks", {"stack_id": list(range(len(frames))),
                                           "frames": frames})]],
        "memory": _memory_files(session, shift_ns),
        "device": [[arrow_table("device", device_columns(session, shift_ns))]],
    }


def _memory_files(session: ProfileSession, shift_ns: int) -> List[Iterator[Any]]:
    """The ``memory`` table's files (``row_files``). Its columns (each allocator record's
    block and category: 1.4 s for 4M records) are made on a thread of their own from
    ``EVENTS_BATCH`` records, while the events are written first; a batch waits for them
    (and raises their error)."""
    n = 0 if session.memory is None else len(session.memory)
    if n < EVENTS_BATCH:
        return row_files("memory", memory_columns(session, shift_ns))
    made: List[Dict[str, Any]] = []
    work = Background(lambda _: made.append(memory_columns(session, shift_ns)),
                      name="opscope-store-memory")
    work.put(None)

    def batches(lo: int, hi: int) -> Iterator[Any]:
        work.finish()
        yield from _batches("memory", _slicer(made[0]), lo, hi)

    return [batches(lo, hi) for lo, hi in _file_spans(n)]


def sessions_table(session: ProfileSession, shift_ns: int, **row: Any):
    """The pyarrow table of a window's one ``sessions`` row (``row``: :func:`session_row`'s
    keywords)."""
    return arrow_table("sessions", session_row(session, shift_ns, **row))
