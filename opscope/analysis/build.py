"""Turn a collector's RawSession into an analysed ProfileSession.

Example::

    >>> from opscope.model.records import RawSession
    >>> build_session(RawSession.empty()).collector
    'native'
"""

from __future__ import annotations

import os

from opscope.analysis.aggregate import filtered_mask
from opscope.analysis.memory import attribute, event_memory, sorted_memory, with_memory_events
from opscope.analysis.stacks import event_stacks
from opscope.analysis.flops import event_flops
from opscope.analysis.tree import build_tree
from opscope.model.events import EventTable
from opscope.model.records import RawSession
from opscope.model.session import ProfileSession


def build_session(raw: RawSession, **kwargs) -> ProfileSession:
    """Drop torch's utility ops, sort, nest and compute self times (and FLOPs with
    ``with_flops`` in ``options``).

    What the source knew besides its records (metadata, marks, memory
    sightings, modules) comes from ``raw``; ``kwargs`` go to ProfileSession
    and win over it.
    """
    table = EventTable.from_raw(raw)
    keep = filtered_mask(table)
    if not keep.all():
        table = table.take(keep)
    table = build_tree(table)
    memory = owner = per_event = None
    options = kwargs.get("options") or {}
    if options.get("profile_memory") or len(raw.memory):
        memory = sorted_memory(raw.memory)
        table, owner = with_memory_events(table, memory, attribute(table, memory))
        per_event = event_memory(table, memory, owner)
    given = dict(metadata=dict(raw.metadata), marks=list(raw.marks),
                 memory_sightings=raw.memory_sightings, modules=raw.modules,
                 module_calls=list(raw.module_calls))
    given.update(kwargs)
    session = ProfileSession(table=table, start_ns=raw.start_ns, stop_ns=raw.stop_ns,
                             epoch_offset_ns=raw.epoch_offset_ns, collector=raw.collector,
                             process_id=raw.process_id or os.getpid(), memory=memory,
                             memory_owner=owner, event_memory=per_event, **given)
    if session.stacks is None:
        session.stacks = event_stacks(table, raw.stack_table)
    if session.options.get("with_flops") and session.flops is None:
        session.flops = event_flops(table)
    return session
