"""Turn a collector's RawSession into an analysed ProfileSession.

Example::

    >>> from opscope.model.records import RawSession
    >>> build_session(RawSession.empty()).collector
    'native'
"""

from __future__ import annotations

import os

from opscope.analysis.aggregate import filtered_mask
from opscope.analysis.flops import event_flops
from opscope.analysis.tree import build_tree
from opscope.model.events import EventTable
from opscope.model.records import RawSession
from opscope.model.session import ProfileSession


def build_session(raw: RawSession, **kwargs) -> ProfileSession:
    """Drop torch's utility ops, sort, nest and compute self times (and FLOPs with
    ``with_flops`` in ``options``).

    ``kwargs`` go to ProfileSession.
    """
    table = EventTable.from_raw(raw)
    keep = filtered_mask(table)
    if not keep.all():
        table = table.take(keep)
    table = build_tree(table)
    session = ProfileSession(table=table, start_ns=raw.start_ns, stop_ns=raw.stop_ns,
                             epoch_offset_ns=raw.epoch_offset_ns, collector=raw.collector,
                             process_id=raw.process_id or os.getpid(), **kwargs)
    if session.options.get("with_flops") and session.flops is None:
        session.flops = event_flops(table)
    return session
