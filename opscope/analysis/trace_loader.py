"""Load a saved trace (opscope's or torch.profiler's) back into a ProfileSession.

``load_session(path)`` reads a ``.json`` or ``.json.gz`` Chrome trace, or a
folder written by ``tensorboard_trace_handler`` (then the newest
``*.pt.trace.json[.gz]`` in it, by modification time), rebuilds the op and
range events as a ``RawSession`` and analyses it with the same
``build_session`` a live profile uses. So every analysis, table and export
works on it as on a live session: what the trace recorded comes back in the
session's usual fields (input shapes, ``stacks`` from ``Call stack``,
``memory``/``event_memory`` from the ``[memory]`` events, ``modules`` from the
module ranges, ``flops`` from the ``flops`` args, ``metadata`` and
``options`` from the top-level keys). For opscope's own traces times
round-trip to the nanosecond, so ``key_averages`` tables come out identical
and the trace written again has the same events.

Any problem with the file raises :class:`TraceLoadError` (a ``ValueError``)
with a one-line message naming the file.

Layering note: this module lives in ``model/`` (the loader is a data source,
like a collector) but ends by calling ``analysis.build.build_session``.

Example::

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

from __future__ import annotations

import dataclasses
import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX
from opscope.model.records import FLAG_MEMORY, SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION
from opscope.model.session import ProfileSession
from opscope.arguments import check_choice
from opscope.model.trace_events import PYTHON_FUNCTION_RULES, TraceContents, trace_contents
from opscope.model.trace_file import TraceLoadError, read_trace_document, resolve_trace_path

BACKWARD_WRAPPER_PREFIX = EVALUATE_FUNCTION_PREFIX

__all__ = ["LoadedSession", "TraceLoadError", "load_session", "resolve_trace_path"]


@dataclass
class LoadedSession(ProfileSession):
    """A ProfileSession read from a trace file, plus what only a file has.

    - ``source_path``: the file read (for a folder, the trace chosen in it);
    - ``python_functions``: the rule applied to the trace's ``python_function``
      events (``trace_events.PYTHON_FUNCTION_RULES``): "absent" (dropped, as
      torch 2.4 to 2.8 did), "counted" (rows, as torch 2.13 counts them) or
      "hidden" (in the tree for self times, not rows, as torch 2.15's
      ``key_averages()`` does by default);
    - ``python_function_rows``: per table row, True where it came from a
      ``python_function`` event (only with the "counted" rule);
    - ``thread_names``: OS thread id -> name from the trace's metadata events.
    """

    source_path: str = ""
    python_function_rows: Optional[np.ndarray] = None
    thread_names: Dict[int, str] = field(default_factory=dict)
    python_functions: str = "counted"


def load_session(path: "str | os.PathLike[str]", *, max_bytes: Optional[int] = None,
                 python_functions: Optional[str] = None) -> LoadedSession:
    """Read the trace at ``path`` (file or folder) into an analysed session.

    ``python_functions`` overrides the rule for ``python_function`` events
    (one of "absent", "counted", "hidden"); None, the default, applies the
    rule of the torch that wrote the trace, so the session's ``key_averages``
    are the ones that torch printed.

    Raises :class:`TraceLoadError` naming the file when it is missing, is not
    a regular file, is over ``max_bytes`` (default ``OPSCOPE_MAX_TRACE_BYTES``
    or 4 GiB; inflated size for gzip), is not a trace (not JSON, no
    ``traceEvents`` list), has an event field of the wrong type or range (see
    ``opscope.model.trace_file``) or is a truncated or corrupt gzip.
    """
    from opscope.analysis.build import build_session

    check_choice("load_session", "python_functions", python_functions,
                 (None,) + PYTHON_FUNCTION_RULES)
    file = resolve_trace_path(path)
    with _collection_paused():
        doc = read_trace_document(file, max_bytes)
        with _malformed_is_load_error(file):
            contents = trace_contents(doc, file, python_functions)
        del doc  # the events are in columns now; free the parsed JSON early
    with _malformed_is_load_error(file):
        session = build_session(contents.raw, options=contents.options,
                                metadata=contents.metadata, modules=_modules(contents),
                                marks=contents.marks)
    return _loaded(session, contents, file)


@contextmanager
def _malformed_is_load_error(file: str) -> Iterator[None]:
    """A value of a type or range the loader did not foresee is still a TraceLoadError.

    The checks in ``trace_events`` name the field for what real traces get
    wrong; this net keeps any other oddity (found by fuzzing) from escaping
    as a bare TypeError or OverflowError.
    """
    try:
        yield
    except TraceLoadError:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError,
            RecursionError) as exc:
        raise TraceLoadError(file, f"malformed trace: a field has an unexpected type or "
                                   f"value ({type(exc).__name__}: {exc})") from exc


def _loaded(session: ProfileSession, contents: TraceContents, file: str) -> LoadedSession:
    """The LoadedSession of a built session: per-row stacks, flops and names from the file."""
    mark_backward_nodes(session.table)
    per_row = _PerRow(contents, session.table)
    if contents.flops is not None:
        session.flops = per_row.take(contents.flops)
    session.stacks = per_row.take(contents.stacks)
    session.trace_name = file
    python_rows = per_row.take(contents.is_python_function)
    if python_rows is None:
        python_rows = np.zeros(len(session.table), dtype=bool)
    if contents.python_functions == "hidden" and python_rows.any():
        _drop_rows(session, python_rows)
        python_rows = np.zeros(len(session.table), dtype=bool)
    fields = {f.name: getattr(session, f.name) for f in dataclasses.fields(ProfileSession)}
    return LoadedSession(
        **fields, source_path=file, python_function_rows=python_rows,
        thread_names=contents.thread_names, python_functions=contents.python_functions)


def _drop_rows(session: ProfileSession, drop: np.ndarray) -> None:
    """Remove the rows ``drop`` from a built session, keeping everyone's self times.

    The self times were computed with those rows in the tree (torch 2.15 builds
    its tree with Python functions, then leaves them out of ``key_averages``);
    per-row values follow, and memory owned by a dropped row is owned by none.
    """
    keep = ~drop
    rows = np.flatnonzero(keep)
    table = session.table
    # a kept row's parent becomes its nearest kept ancestor (pointer jumping; -1 stays -1)
    parent = table.parent.astype(np.int64)
    dropped = np.append(drop, False)  # index -1 (no parent) is never dropped
    while dropped[parent].any():
        parent = np.where(dropped[parent], np.append(parent, -1)[parent], parent)
    table.parent = parent.astype(table.parent.dtype)
    session.table = table.take(keep)
    if session.stacks is not None:
        session.stacks = [session.stacks[i] for i in rows.tolist()]
    if session.flops is not None:
        session.flops = session.flops[rows]
    if session.event_memory is not None:
        session.event_memory = {k: v[rows] for k, v in session.event_memory.items()}
    if session.memory_owner is not None:
        remap = np.full(len(keep) + 1, -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        owner = np.asarray(session.memory_owner)
        session.memory_owner = remap[owner].astype(owner.dtype)


class _PerRow:
    """Maps per-record values (trace order, sorted) to the session's table rows.

    The table holds the records ``build_session`` kept, in their order, plus
    the ``[memory]`` events it adds for allocations outside any op
    (``FLAG_MEMORY``), which take 0 or None.
    """

    def __init__(self, contents: TraceContents, table):
        self.contents = contents
        self.table = table
        self._rows: Optional[np.ndarray] = None
        self._records: Optional[np.ndarray] = None

    def take(self, values):
        """``values`` (per record) picked for each table row; None stays None."""
        if values is None:
            return None
        if self._rows is None:
            self._records = kept_records(self.contents)
            self._rows = np.flatnonzero((self.table.flags & FLAG_MEMORY) == 0)
            if len(self._rows) != len(self._records):  # cannot happen (see kept_records)
                raise AssertionError("trace loader: table rows do not match the records")
        if isinstance(values, np.ndarray):
            out = np.zeros(len(self.table), dtype=values.dtype)
            out[self._rows] = values[self._records]
            return out
        out_list: List[Any] = [None] * len(self.table)
        for row, record in zip(self._rows.tolist(), self._records.tolist()):
            out_list[row] = values[record]
        return out_list


def _modules(contents: TraceContents) -> Optional[Dict[str, Any]]:
    """Module infos of the module ranges; None when the trace recorded no modules."""
    if not contents.module_args:
        return {} if contents.options.get("with_modules") else None
    from opscope.model.modules import module_info_from_trace_args

    out = {}
    for name, args in contents.module_args.items():
        info = module_info_from_trace_args(name, args)
        if info is not None:
            out[name] = info
    return out


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of JSON objects are made.

    They form no cycles, yet each allocation burst triggers full collections
    over the growing heap: pausing halves the time to parse a large trace.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def mark_backward_nodes(table) -> None:
    """Give autograd nodes without a sequence number their backward scope back.

    The trace marks a backward node only by its ``Fwd thread id``, which is
    written only with a sequence number; a node without one (``AccumulateGrad``)
    is recognised as a child named like its
    ``autograd::engine::evaluate_function: <node>`` parent.
    """
    if len(table) == 0:
        return
    names = table.symbols.names
    wrapper_of = np.full(len(names), -1, dtype=np.int64)
    for node_id, name in enumerate(names):
        wrapper = table.symbols.id_of(BACKWARD_WRAPPER_PREFIX + name)
        if wrapper is not None:
            wrapper_of[node_id] = wrapper
    has = (table.parent >= 0) & (table.scope == SCOPE_FUNCTION)
    rows = np.flatnonzero(has)
    expected = wrapper_of[table.name_id[rows]]
    match = (expected >= 0) & (table.name_id[table.parent[rows]] == expected)
    table.scope[rows[match]] = SCOPE_BACKWARD_FUNCTION


def kept_records(contents: TraceContents) -> np.ndarray:
    """Indices of the records ``build_session`` keeps, in table order.

    The records are already in table order; ``build_session`` only drops
    utility ops and folds same-name only-children, and this repeats exactly
    those two steps.
    """
    from opscope.analysis.aggregate import filtered_mask
    from opscope.analysis.tree import assign_parents, fold_duplicate_children
    from opscope.model.events import EventTable

    table = EventTable.from_raw(contents.raw)
    keep = filtered_mask(table)
    rows = np.flatnonzero(keep)
    if not keep.all():
        table = table.take(keep)
    folded = fold_duplicate_children(table, assign_parents(table))
    return rows[folded]
