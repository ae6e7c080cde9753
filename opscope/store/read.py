"""Read a window of a store back: the RawSession it was, and the session built from it.

``read_window(store, rank, window)`` rebuilds the RawSession whose
``build_session`` gives the session that was written: the same events, tree,
self times, inputs, stacks, FLOPs, memory and settings, so its
``key_averages()`` tables and Chrome trace are the ones of the original.
``load_store_session`` builds it. The rows come from the window's Parquet
files with pyarrow; no query engine is needed.

Example::

    >>> import os, tempfile, numpy as np
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import NO_INPUTS, RawSession, records_from_rows
    >>> from opscope.store.write import StoreWriter
    >>> raw = RawSession(records_from_rows([(5, 9, -1, 0, 0, 0, 1, NO_INPUTS, 0, 0, 0)]),
    ...                  [], [42], ["aten::mm"], 0, 20, 1000)
    >>> path = os.path.join(tempfile.mkdtemp(), "store")
    >>> with StoreWriter(path) as w:
    ...     w.write_window(build_session(raw))
    0
    >>> back = read_window(path)
    >>> back.names, back.records["start_ns"].tolist(), back.thread_ids
    (['aten::mm'], [5], [42])
    >>> windows(path)
    [(0, 0)]
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.analysis.collectives import CollectiveCall
from opscope.model.records import MEMORY_DTYPE, NO_INPUTS, RECORD_DTYPE, RawSession
from opscope.model.session import OPTION_NAMES, ProfileSession
from opscope.store.budget import SESSION_FACTOR, check_memory, rows_size
from opscope.store.extras import read_extras
from opscope.store.folder import (check_store_folder, part_footer, partition_values, read_files,
                                  read_part)
from opscope.store.parts import RECORDED_TABLES, check_recorded
from opscope.store.schema import StoreError, load_json, part_path, require_pyarrow


def windows(store: "str | os.PathLike[str]") -> List[Tuple[int, int]]:
    """Every (rank, window) with a sessions partition, sorted."""
    store = check_store_folder(os.fspath(store), create=False)
    root = os.path.join(store, "sessions")
    return [(r, w) for r in partition_values(root, "rank")
            for w in partition_values(os.path.join(root, f"rank={r}"), "window")]


def sessions_of_rank(store: str, rank: int) -> List[Dict[str, Any]]:
    """The sessions row of each window of ``rank``, with its ``window`` added."""
    out = []
    for w in partition_values(os.path.join(store, "sessions", f"rank={int(rank)}"), "window"):
        part = read_part(store, "sessions", rank, w)
        if part is not None and part.num_rows:
            row = part.slice(0, 1).to_pylist()[0]
            row["window"] = w
            out.append(row)
    return out


def stored_calls(store: str, rank: int) -> List[Tuple[int, CollectiveCall]]:
    """(window, call) of each collective stored for ``rank``."""
    part = read_part(store, "collectives", rank)
    if part is None:
        return []
    return [(int(r["window"]), CollectiveCall(r["kind"], r["bytes"], r["arrival_ns"],
                                              r["end_ns"], r["duration_ns"], r["call_site"],
                                              r["fr_pg"], r["fr_seq"], r["pg_desc"],
                                              r["in_nelems"], r["out_nelems"], r["dtype"]))
            for r in part.to_pylist()]


def _ints(table, name: str, fill: int = 0) -> np.ndarray:
    """A column as int64 numpy, nulls as ``fill``."""
    column = table.column(name)
    if column.null_count:
        column = column.fill_null(fill)
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _strings(table, name: str) -> Tuple[np.ndarray, List[str]]:
    """(code per row, distinct strings) of a string column, nulls as code -1."""
    pa, _ = require_pyarrow()
    import pyarrow.compute as pc

    column = table.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    encoded = pc.dictionary_encode(column).combine_chunks()
    codes = np.asarray(encoded.indices.fill_null(-1).to_numpy(), dtype=np.int64)
    return codes, [str(s) for s in encoded.dictionary.to_pylist()]


def _pick(store: str, rank: Optional[int], window: Optional[int]) -> Tuple[int, int]:
    found = windows(store)
    if rank is not None:
        found = [(r, w) for r, w in found if r == rank]
    if window is not None:
        found = [(r, w) for r, w in found if w == window]
    if not found:
        raise StoreError(f"store {store!r} has no window"
                         f"{'' if rank is None else f' of rank {rank}'}"
                         f"{'' if window is None else f' numbered {window}'}")
    return found[0]


def _input_blobs(events, inputs, rows: np.ndarray, thread_index: np.ndarray,
                 n_threads: int) -> Tuple[List[np.ndarray], np.ndarray]:
    """Per thread, a blob holding each input signature it uses once; offset per row."""
    input_id = _ints(events, "input_id", -1)[rows]
    words = {} if inputs is None else dict(zip(inputs.column("input_id").to_pylist(),
                                               inputs.column("words").to_pylist()))
    offsets = np.full(len(rows), NO_INPUTS, dtype=np.int64)
    blobs: List[List[int]] = [[] for _ in range(n_threads)]
    where: Dict[Tuple[int, int], int] = {}
    for i in np.flatnonzero(input_id >= 0).tolist():
        key = (int(thread_index[i]), int(input_id[i]))
        off = where.get(key)
        if off is None:
            blob = blobs[key[0]]
            off = where[key] = len(blob)
            blob.extend(words.get(key[1]) or [0])
        offsets[i] = off
    return [np.array(b, dtype=np.int64) for b in blobs], offsets


def _json(text: Optional[str], what: str, where: str, default: Any) -> Any:
    try:
        value = load_json(text) if text else default
    except ValueError:
        raise StoreError(f"{where}: sessions.{what} is not JSON") from None
    if not isinstance(value, type(default)):
        raise StoreError(f"{where}: sessions.{what} is not a JSON {type(default).__name__}")
    return value


def _records(events, extras: Dict[str, Any], shift: int
             ) -> Tuple[np.ndarray, np.ndarray, List[str]]:
    """(records in the source's order, event row per record (-1: hidden), names)."""
    record = _ints(events, "record", -1)
    rows = np.flatnonzero(record >= 0)  # rows the analysis added come back by themselves
    hidden = extras["hidden_records"]
    source_index = np.concatenate([record[rows], np.asarray(extras["hidden_index"], np.int64)])
    order = np.argsort(source_index, kind="stable")
    row_of = np.concatenate([rows, np.full(len(hidden), -1, dtype=np.int64)])[order]
    codes, names = _strings(events, "name")
    hidden_codes = [len(names) + i for i in range(len(hidden))]
    all_names = names + extras["hidden_names"]
    name_code = np.concatenate([codes[rows], np.asarray(hidden_codes, np.int64)])[order]
    used, name_id = np.unique(name_code, return_inverse=True)  # dense ids
    recs = np.zeros(len(order), RECORD_DTYPE)
    recs["name_id"] = name_id.reshape(-1)
    for field in ("start_ns", "end_ns", "seq_nr", "thread_index", "fwd_thread_id",
                  "rf_thread_id", "scope", "flags"):
        mine = _ints(events, field)[rows]
        if field in ("start_ns", "end_ns"):
            mine = mine - shift
        theirs = hidden[field].astype(np.int64)
        recs[field] = np.concatenate([mine, theirs])[order].astype(recs.dtype[field])
    recs["input_offset"] = NO_INPUTS
    return recs, row_of, [all_names[int(c)] for c in used.tolist()]


def read_window(store: "str | os.PathLike[str]", rank: Optional[int] = None,
                window: Optional[int] = None, *, memory_limit: Optional[int] = None
                ) -> RawSession:
    """The RawSession of one window (default: the lowest rank's first window).

    Raises StoreError naming the store when it is not one, or has no such window;
    naming a file whose footer disagrees with what the window's sessions row
    records (``opscope.store.parts``); and, with ``memory_limit`` (bytes), when
    building a session from the window would need more (``opscope.store.budget``).
    """
    store = os.fspath(store)
    rank, window = _pick(store, rank, window)
    where = f"store {store!r}, rank {rank}, window {window}"
    try:
        return _read_window(store, rank, window, where, memory_limit)
    except (ValueError, TypeError, KeyError, IndexError, NotImplementedError,
            OverflowError) as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None


def _checked_parts(store: str, rank: int, window: int, where: str, recorded: Dict[str, Any],
                   memory_limit: Optional[int]) -> Dict[str, Any]:
    """The window's partition tables, each footer checked against ``recorded`` (the
    sessions row's ``extras.parts``) and the memory they need against ``memory_limit``
    before a row is read; None for a file that does not exist."""
    found = {t: part_footer(store, t, rank, window) for t in RECORDED_TABLES}
    for table, figures in recorded.items():
        part = found[table]
        check_recorded(where, table, part_path(store, table, rank, window) if part is None
                       else part.name, None if part is None else part.footer, figures)
    need = sum(rows_size(t, f.footer) for t, f in found.items() if f is not None)
    check_memory(where, SESSION_FACTOR * need, memory_limit)
    return {t: None if f is None else read_files(store, f.files) for t, f in found.items()}


def _read_window(store: str, rank: int, window: int, where: str,
                 memory_limit: Optional[int] = None) -> RawSession:
    session = read_part(store, "sessions", rank, window)
    if session is None or not session.num_rows:
        raise StoreError(f"{where}: the events or sessions file is missing")
    row = session.slice(0, 1).to_pylist()[0]
    extras = read_extras(row.get("extras"), where)
    parts = _checked_parts(store, rank, window, where, extras["parts"], memory_limit)
    events = parts["events"]
    if events is None:
        raise StoreError(f"{where}: the events or sessions file is missing")
    shift = int(row["epoch_offset_ns"] or 0) + int(row["clock_offset_ns"] or 0)
    recs, row_of, names = _records(events, extras, shift)
    thread_ids = extras["thread_ids"]
    threads = recs["thread_index"]
    n_threads = max(len(thread_ids), int(threads.max()) + 1 if len(recs) else 0)
    if len(recs) and (int(threads.min()) < 0 or n_threads > len(thread_ids) + len(recs)):
        raise StoreError(f"{where}: events.thread_index out of range")
    thread_ids = thread_ids + [0] * (n_threads - len(thread_ids))
    kept = np.flatnonzero(row_of >= 0)
    blobs, offsets = _input_blobs(events, parts["inputs"], row_of[kept],
                                  recs["thread_index"][kept], n_threads)
    recs["input_offset"][kept] = offsets
    raw = RawSession(recs, blobs, thread_ids, names, int(row["start_ns"]) - shift,
                     int(row["stop_ns"]) - shift, int(row["epoch_offset_ns"] or 0),
                     collector=row["collector"] or "native",
                     process_id=int(row["process_id"] or 0),
                     metadata={str(k): v if isinstance(v, str) else json.dumps(v) for k, v in
                               _json(row["metadata"], "metadata", where, {}).items()})
    _add_rows(raw, parts, row_of, kept, extras, shift)
    options = _json(row["options"], "options", where, {})
    raw.options = {k: options.get(k) is True for k in OPTION_NAMES}
    raw.thread_names, raw.marks = extras["thread_names"], extras["marks"]
    raw.modules, raw.module_calls = extras["modules"], extras["module_calls"]
    raw.memory_sightings = extras["memory_sightings"]
    raw.source_path = row["source_path"] or ""
    raw.python_functions = row["python_functions"] or "counted"
    _add_device(raw, parts.get("device"), row_of, shift)
    if "correlation" in events.column_names and events.column("correlation").null_count < \
            events.num_rows:  # CUDA API calls' ids (stores from before them have none)
        correlation = np.zeros(len(raw.records), dtype=np.uint32)
        correlation[kept] = _ints(events, "correlation")[row_of[kept]]
        raw.correlation = correlation
    return raw


def _add_device(raw: RawSession, device, row_of: np.ndarray, shift: int) -> None:
    """A device collector's records, and the correlation ids of their launching calls."""
    from opscope.model.device import CATEGORIES, DEVICE_DTYPE

    if device is None or not device.num_rows:
        return
    out = np.zeros(device.num_rows, DEVICE_DTYPE)
    for field in ("start_ns", "end_ns"):
        out[field] = _ints(device, field) - shift
    for field in ("correlation", "bytes", "device", "stream", "registers", "context"):
        out[field] = _ints(device, field)
    for field in ("grid", "block"):
        out[field] = [v if isinstance(v, list) and len(v) == 3 else [0, 0, 0]
                      for v in device.column(field).to_pylist()]
    out["shared_static"] = _ints(device, "shared_memory")
    kind_of = {v: k for k, v in CATEGORIES.items()}
    cats, cat_names = _strings(device, "category")
    out["kind"] = [kind_of.get(cat_names[c], 1) if c >= 0 else 1 for c in cats.tolist()]
    codes, names = _strings(device, "name")
    out["name_id"] = codes
    raw.device, raw.device_names = out, names
    record_of_row = np.full(int(row_of.max()) + 1 if len(row_of) else 0, -1, dtype=np.int64)
    has = np.flatnonzero(row_of >= 0)
    record_of_row[row_of[has]] = has
    correlation = np.zeros(len(raw.records), dtype=np.uint32)
    launch = _ints(device, "launch_event", -1)
    ok = (launch >= 0) & (launch < len(record_of_row))
    records = record_of_row[launch[ok]]
    correlation[records[records >= 0]] = out["correlation"][ok][records >= 0]
    raw.correlation = correlation


def _add_rows(raw: RawSession, parts: Dict[str, Any], row_of: np.ndarray, kept: np.ndarray,
              extras: Dict[str, Any], shift: int) -> None:
    """Stacks, FLOPs and memory records of the window, per record."""
    events, stacks, memory = parts["events"], parts["stacks"], parts["memory"]
    if extras["has_stacks"]:
        frames = {} if stacks is None else dict(zip(stacks.column("stack_id").to_pylist(),
                                                    stacks.column("frames").to_pylist()))
        table = [list(frames.get(i) or []) for i in range(max(frames, default=-1) + 1)]
        ids = np.full(len(row_of), -1, dtype=np.int64)
        ids[kept] = _ints(events, "stack_id", -1)[row_of[kept]]
        raw.stack_table, raw.stack_ids = table, ids
        raw.link_backward_stacks = False  # each event's own stack, as it was written
    if events.column("flops").null_count < events.num_rows:
        flops = np.zeros(len(row_of), dtype=np.int64)
        flops[kept] = _ints(events, "flops")[row_of[kept]]
        raw.flops = flops
    if memory is not None and memory.num_rows:
        out = np.zeros(memory.num_rows, MEMORY_DTYPE)
        for name in MEMORY_DTYPE.names:
            if name != "pad":
                out[name] = _ints(memory, name)
        out["time_ns"] -= shift
        raw.memory = out


def load_store_session(store: "str | os.PathLike[str]", rank: Optional[int] = None,
                       window: Optional[int] = None, *, memory_limit: Optional[int] = None
                       ) -> ProfileSession:
    """The session of one window of a store, built as it was when written; ``memory_limit``
    as :func:`read_window` takes it."""
    from opscope.analysis.build import build_session

    raw = read_window(store, rank, window, memory_limit=memory_limit)
    return build_session(raw)
