"""Python stacks per event, with backward ops linked to their forward op.

The collector gives each op the Python stack of the thread that ran it. A
backward node (``AddmmBackward0``) runs from ``loss.backward()``, which says
nothing about the model code, so it takes the stack of the forward op that
created it (same sequence number, the forward op's thread), and every op it
runs inherits that stack.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> event_stacks(build_session(RawSession.empty()).table, None) is None
    True
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from opscope.analysis.ancestry import nearest_marked
from opscope.analysis.autograd_links import forward_ops
from opscope.model.events import EventTable
from opscope.model.records import (FLAG_SOURCE_STACK, NO_STACK, SCOPE_BACKWARD_FUNCTION,
                                   SCOPE_FUNCTION)


def backward_stack_ids(table: EventTable) -> np.ndarray:
    """Stack id per event, with backward nodes and their ops given the forward stack."""
    sid = table.stack_id.copy()
    scope = table.scope
    seq = table.seq_nr
    is_bwd = (scope == SCOPE_BACKWARD_FUNCTION) & (seq >= 0)
    if not is_bwd.any():
        return sid
    bwd = np.flatnonzero(is_bwd)
    fwd = forward_ops(table, bwd, (scope == SCOPE_FUNCTION) & (sid != NO_STACK))
    found = fwd >= 0
    sid[bwd[found]] = sid[fwd[found]]
    # ops under a backward node (not themselves nodes) take the nearest node's stack
    node = nearest_marked(table.parent, is_bwd)
    under = (node >= 0) & ~is_bwd & ((table.flags & FLAG_SOURCE_STACK) == 0)
    sid[under] = sid[node[under]]
    return sid


def event_stacks(table: EventTable, stack_table: Optional[List[List[str]]]
                 ) -> Optional[List[Optional[List[str]]]]:
    """Frames (innermost first) per event, or None when no stacks were recorded."""
    if stack_table is None:
        return None
    sid = backward_stack_ids(table).tolist()
    return [stack_table[s] if s >= 0 else None for s in sid]
