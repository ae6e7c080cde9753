"""Per-event facts of a session: columns computed once and cached on the session.

Each fact is ``session.derived(key, compute)`` (``opscope.model.session``): the
first reader computes it, every later one (the Chrome trace, the report, the
tables) reads the same array. Exporters and the report take these facts from
here and never work them out while they write.

- :func:`module_ranges`: which events are module ranges (``with_modules``);
- :func:`event_modules`: the module range (one call) each event belongs to;
- :func:`step_ranges` and :func:`event_steps`: the ``ProfilerStep#N`` ranges,
  and the one each event ran in;
- :func:`forward_links`: for a backward node, the forward op that created it;
- :func:`inputs_recorded`: whether an event's inputs were recorded, and
  :func:`shapes_recorded`, the one rule for "were shapes recorded?";
- :func:`event_flops` and :func:`event_memory`: the per-event FLOPs and memory
  the session carries, or None.

Example (times in ns; a step range holding an op)::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import NO_INPUTS, SCOPE_USER, RawSession, records_from_rows
    >>> rows = [(0, 100, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
    ...         (10, 60, -1, 1, 0, 0, 1, NO_INPUTS, 0, 0, 0)]
    >>> s = build_session(RawSession(records_from_rows(rows), [], [1],
    ...                              ["ProfilerStep#1", "aten::mm"], 0, 100, 0))
    >>> event_steps(s).tolist(), step_ranges(s).tolist()
    ([0, 0], [0])
    >>> forward_links(s).tolist(), shapes_recorded(s)
    ([-1, -1], False)
    >>> event_steps(s) is event_steps(s)  # computed once
    True
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from opscope.analysis.ancestry import nearest_marked
from opscope.analysis.autograd_links import forward_candidates, forward_ops
from opscope.analysis.module_owners import module_owner_rows, module_range_mask
from opscope.model.records import NO_INPUTS, SCOPE_BACKWARD_FUNCTION
from opscope.model.session import ProfileSession
from opscope.model.torch_names import PROFILER_STEP_PREFIX


def module_ranges(session: ProfileSession) -> np.ndarray:
    """Per event: True for a module range (a user range named as a module of ``session.modules``)."""
    return session.derived("module_range", module_range_mask)


def event_modules(session: ProfileSession) -> np.ndarray:
    """Per event, the row of the module range (one call) it belongs to; -1 for none.

    A module range belongs to itself; a backward op to the module whose
    forward created its autograd node (see ``opscope.analysis.module_owners``).
    """
    return session.derived("module", lambda s: module_owner_rows(s, module_ranges(s)))


def step_ranges(session: ProfileSession) -> np.ndarray:
    """Rows of the ``ProfilerStep#N`` ranges, in table (start) order."""
    return session.derived("step_ranges", _step_ranges)


def _step_ranges(session: ProfileSession) -> np.ndarray:
    return np.flatnonzero(session.table.named_like(PROFILER_STEP_PREFIX))


def event_steps(session: ProfileSession) -> np.ndarray:
    """Per event, the index (into :func:`step_ranges`) of the step range it ran in; -1: none.

    An event is in a step when it is nested in the step's range (so on the
    step's thread); a step range is in itself.
    """
    return session.derived("step", _event_steps)


def _event_steps(session: ProfileSession) -> np.ndarray:
    table = session.table
    steps = step_ranges(session)
    if len(steps) == 0:
        return np.full(len(table), -1, dtype=np.int64)
    is_step = np.zeros(len(table), dtype=bool)
    is_step[steps] = True
    index = np.full(len(table) + 1, -1, dtype=np.int64)  # row -> step index; [-1]: none
    index[steps] = np.arange(len(steps))
    return index[nearest_marked(table.parent, is_step)]


def forward_links(session: ProfileSession) -> np.ndarray:
    """Per event, the row of the forward op that created it (a backward node); else -1.

    A backward node (scope BACKWARD_FUNCTION, ``seq_nr >= 0``) links to the
    outermost forward op (``autograd_links.forward_candidates``) with the same
    ``seq_nr`` whose ``rf_thread_id`` is the node's ``fwd_thread_id``; these
    pairs are the Chrome trace's ``fwdbwd`` flows.
    """
    return session.derived("forward_op", _forward_links)


def _forward_links(session: ProfileSession) -> np.ndarray:
    t = session.table
    out = np.full(len(t), -1, dtype=np.int64)
    bwd = np.flatnonzero((t.scope == SCOPE_BACKWARD_FUNCTION) & (t.seq_nr >= 0))
    if len(bwd):  # (no backward: no pass over the forward ops)
        out[bwd] = forward_ops(t, bwd, forward_candidates(t))
    return out


def inputs_recorded(session: ProfileSession) -> np.ndarray:
    """Per event: True where its inputs (shapes, types, values) were recorded."""
    return session.derived("inputs", _inputs_recorded)


def _inputs_recorded(session: ProfileSession) -> np.ndarray:
    table = session.table
    if table.raw is None:
        return np.zeros(len(table), dtype=bool)
    return table.input_offset != NO_INPUTS


def shapes_recorded(session: ProfileSession) -> bool:
    """Were input shapes recorded? Yes with ``record_shapes``, or when any event has inputs.

    The one rule every reader (report, CLI, recommendations) asks.
    """
    return bool(session.options.get("record_shapes")) or bool(inputs_recorded(session).any())


def _aligned(session: ProfileSession, name: str) -> Optional[np.ndarray]:
    values = getattr(session, name, None)
    if values is None or len(values) != len(session.table):
        return None
    return np.asarray(values)


def event_flops(session: ProfileSession) -> Optional[np.ndarray]:
    """Per-event FLOPs (table order), or None when FLOPs were not estimated."""
    return _aligned(session, "flops")


def event_memory(session: ProfileSession) -> Optional[Dict[str, np.ndarray]]:
    """Per-event ``cpu_memory_usage``/``self_cpu_memory_usage`` (float64), or None."""
    return session.derived("memory", _event_memory)


def _event_memory(session: ProfileSession) -> Optional[Dict[str, np.ndarray]]:
    self_mem = _aligned(session, "self_cpu_memory")
    if self_mem is None:
        return None
    total = _aligned(session, "cpu_memory")
    return {"self_cpu_memory_usage": self_mem.astype(np.float64),
            "cpu_memory_usage": (total if total is not None else self_mem).astype(np.float64)}
