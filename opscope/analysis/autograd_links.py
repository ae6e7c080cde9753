"""Link backward events to the forward op that created them.

Autograd gives a backward node the sequence number of the forward op that
recorded it, and runs it with that op's thread id in ``fwd_thread_id``. So
the forward op of a backward row is the op with the same ``seq_nr`` whose
``rf_thread_id`` is the row's ``fwd_thread_id``.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> table = build_session(RawSession.empty()).table
    >>> forward_ops(table, np.zeros(0, np.int64), np.zeros(0, bool)).tolist()
    []
"""

from __future__ import annotations

import numpy as np

from typing import Tuple

from opscope.model.events import EventTable
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION
from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX


def _keys(thread: np.ndarray, seq: np.ndarray) -> np.ndarray:
    return (thread.astype(np.int64) << 40) | seq.astype(np.int64)


def forward_ops(table: EventTable, backward_rows: np.ndarray, candidates: np.ndarray,
                latest: bool = False) -> np.ndarray:
    """Per row in ``backward_rows``, the row of its forward op, or -1.

    Only rows where ``candidates`` is true (and ``seq_nr >= 0``) are forward
    ops. When several share a key, the first in table order wins (the
    outermost op), or the last with ``latest``.
    """
    out = np.full(len(backward_rows), -1, dtype=np.int64)
    if len(backward_rows) == 0:
        return out
    fwd = np.flatnonzero(candidates & (table.seq_nr >= 0))
    if len(fwd) == 0:
        return out
    if latest:
        fwd = fwd[::-1]
    keys, first = np.unique(_keys(table.rf_thread_id[fwd], table.seq_nr[fwd]),
                            return_index=True)
    wanted = _keys(table.fwd_thread_id[backward_rows], table.seq_nr[backward_rows])
    pos = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    hit = keys[pos] == wanted
    out[hit] = fwd[first[pos[hit]]]
    return out


def backward_marks(table: EventTable) -> Tuple[np.ndarray, np.ndarray]:
    """(backward nodes, ``evaluate_function`` wrappers around them) as two masks.

    A node has scope BACKWARD_FUNCTION; its wrapper is the range autograd's
    engine records around it (``autograd::engine::evaluate_function: <Node>``).

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> [m.tolist() for m in backward_marks(build_session(RawSession.empty()).table)]
    [[], []]
    """
    names = table.symbols.names
    wrapper_ids = [i for i, n in enumerate(names) if n.startswith(EVALUATE_FUNCTION_PREFIX)]
    nodes = table.scope == SCOPE_BACKWARD_FUNCTION
    return nodes, np.isin(table.name_id, wrapper_ids) & ~nodes


def forward_candidates(table: EventTable) -> np.ndarray:
    """True for the ops that may have created a backward node.

    A forward op has scope FUNCTION and ``fwd_thread_id`` 0: ops run by the
    autograd engine carry the forward thread there, so they are never taken
    for the forward op.
    """
    return (table.scope == SCOPE_FUNCTION) & (table.fwd_thread_id == 0)
