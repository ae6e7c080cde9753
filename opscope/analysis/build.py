"""Turn a source's RawSession into an analysed ProfileSession: the one way sessions are made.

Both sources give a RawSession: a live collector (``opscope.collect``, through
``opscope.profile``) and a saved trace (``opscope.load``). ``build_session``
builds either the same way, and ``load_session(path)`` is
``build_session(read_trace(path))``. Everything a session holds goes in here;
nothing edits a session after it is built.

Example::

    >>> from opscope.model.records import RawSession
    >>> build_session(RawSession.empty()).collector
    'native'
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional

import numpy as np

from opscope.analysis.aggregate import filtered_mask
from opscope.analysis.compiled_modules import with_compiled_modules
from opscope.analysis.device import link_device, with_api_calls
from opscope.analysis.flight_recorder import flight_facts
from opscope.analysis.flops import event_flops
from opscope.analysis.memory import attribute, event_memory, sorted_memory, with_memory_events
from opscope.analysis.stacks import event_stacks
from opscope.analysis.trace_reading import scanner_for
from opscope.analysis.tree import build_tree, infer_backward_nodes, without_rows
from opscope.load import read_trace
from opscope.load.read import malformed_is_load_error
from opscope.model.events import EventTable
from opscope.model.records import FLAG_PYTHON_FUNCTION, RawSession
from opscope.model.session import ProfileSession


def build_session(raw: RawSession, **kwargs: Any) -> ProfileSession:
    """Drop torch's utility ops, sort, nest, compute self times, attribute memory,
    give each event its stack and (with ``with_flops``) its FLOPs.

    The options come from ``options=`` or ``raw.options``; what the source knew
    besides its records (metadata, marks, memory sightings, modules, thread
    names) from ``raw``. Other ``kwargs`` go to ProfileSession and win over it.
    """
    options = kwargs.pop("options", None) or raw.options
    raw = with_api_calls(raw)  # CUDA API calls nest under their ops like any op
    raw = with_compiled_modules(raw)  # compiled graphs' kernels: their modules and lines
    table = EventTable.from_raw(raw)
    # the table holds the records as columns now: drop them (48 bytes each) before the tree
    raw = table.raw = _without_records(raw)
    keep = filtered_mask(table)
    if not keep.all():
        table = table.take(keep)
    table = build_tree(table)
    infer_backward_nodes(table)
    fields: Dict[str, Any] = dict(memory=None, memory_owner=None, event_memory=None)
    if (options or {}).get("profile_memory") or len(raw.memory):
        memory = sorted_memory(raw.memory)
        table, owner = with_memory_events(table, memory, attribute(table, memory))
        fields.update(memory=memory, memory_owner=owner,
                      event_memory=event_memory(table, memory, owner))
    fields["stacks"] = _stacks(table, raw)
    fields["flops"] = _flops(table, raw, options)
    if raw.python_functions == "hidden":
        hidden = (table.flags & FLAG_PYTHON_FUNCTION) != 0
        if hidden.any():
            table, fields = without_rows(table, hidden, fields)
    if options is not None:
        fields["options"] = dict(options)
    fields["fused_modules"] = _by_row(table, raw.fused_modules)
    fields["collective_facts"] = _by_row(table, raw.collective_facts) or flight_facts(
        table, raw.metadata, raw.epoch_offset_ns)
    if raw.device is not None:
        fields["device"] = link_device(table, raw)
    fields.update(
        metadata=dict(raw.metadata), marks=list(raw.marks), modules=raw.modules,
        memory_sightings=raw.memory_sightings, module_calls=list(raw.module_calls),
        thread_names=dict(raw.thread_names), source_path=raw.source_path,
        python_functions=raw.python_functions, trace_name=raw.source_path or None)
    fields.update(kwargs)
    return ProfileSession(table=table, start_ns=raw.start_ns, stop_ns=raw.stop_ns,
                          epoch_offset_ns=raw.epoch_offset_ns, collector=raw.collector,
                          process_id=raw.process_id or os.getpid(), **fields)


def load_session(path: "str | os.PathLike[str]", *, max_bytes: Optional[int] = None,
                 python_functions: Optional[str] = None, lean: bool = False) -> ProfileSession:
    """The session of the saved trace at ``path`` (file or folder), built as a live one.

    ``python_functions`` overrides the rule for ``python_function`` events
    (one of "absent", "counted", "hidden"); None, the default, applies the
    rule of the torch that wrote the trace, so the session's ``key_averages``
    are the ones that torch printed. ``lean`` reads the args of the
    collectives only (``opscope.load.trace_columns``): enough for a rank's
    facts, twice as fast, but the other ops have no inputs, stacks or FLOPs.

    Raises :class:`opscope.load.TraceLoadError` (a ValueError) naming the file
    when it is missing, is not a regular file, is over ``max_bytes`` (default
    ``OPSCOPE_MAX_TRACE_BYTES`` or 4 GiB; inflated size for gzip), is not a
    trace (not JSON, no ``traceEvents`` list), has an event field of the wrong
    type or range or is a truncated or corrupt gzip.

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> _ = open(path, "w").write(json.dumps({"record_shapes": 1, "traceEvents": [
    ...     {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 2,
    ...      "ts": 0, "dur": 10},
    ...     {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2,
    ...      "ts": 1, "dur": 5}]}))
    >>> s = load_session(path)
    >>> [s.table.name(i) for i in range(len(s.table))], s.table.self_ns.tolist()
    (['step', 'aten::mm'], [5000, 5000])
    >>> s.options["record_shapes"], s.source_path == path
    (True, True)
    """
    raw = read_trace(path, max_bytes=max_bytes, python_functions=python_functions, lean=lean,
                     scanner=scanner_for)
    with malformed_is_load_error(raw.source_path):
        return build_session(raw)


def _stacks(table: EventTable, raw: RawSession) -> Optional[List[Optional[List[str]]]]:
    """Frames per row: a saved trace's as written, a recording's linked to forward ops."""
    if raw.link_backward_stacks or raw.stack_table is None:
        return event_stacks(table, raw.stack_table)
    frames = raw.stack_table
    return [frames[s] if s >= 0 else None for s in table.stack_id.tolist()]


def _without_records(raw: Optional[RawSession]) -> Optional[RawSession]:
    """``raw`` without its records and stack ids, once the table holds them as columns.

    A session keeps its source for the recorded inputs (and a device's
    correlation ids); the records themselves (48 bytes each) are only read
    again for the python_function records a "hidden" rule leaves out of the
    table (``opscope.store.extras.hidden_records``), so those are kept.

    >>> raw = RawSession.empty()
    >>> raw.records = np.zeros(3, raw.records.dtype)
    >>> len(_without_records(raw).records), len(raw.records)
    (0, 3)
    """
    if raw is None or raw.python_functions == "hidden":
        return raw
    # a new empty array: a view of no records would still hold them all
    return dataclasses.replace(raw, records=np.zeros(0, raw.records.dtype), stack_ids=None)


def _by_row(table: EventTable, by_record: Dict[int, Any]) -> Dict[int, Any]:
    """Row -> value of the rows whose record has one in ``by_record`` (sparse, per record)."""
    if not by_record:
        return {}
    rows = np.flatnonzero(np.isin(table.record, list(by_record)))
    return {row: by_record[record]
            for row, record in zip(rows.tolist(), table.record[rows].tolist())}


def _flops(table: EventTable, raw: RawSession,
           options: Optional[Dict[str, bool]]) -> Optional[np.ndarray]:
    """FLOPs per row: the source's own where it has them, else estimated with ``with_flops``."""
    if raw.flops is not None:
        given = np.append(np.asarray(raw.flops, dtype=np.int64), 0)
        return given[table.record]  # record -1 (a row the analysis added) picks the 0
    if (options or {}).get("with_flops"):
        return event_flops(table)
    return None
