"""Give each collective's event its facts: group, number, sizes, call site, peer.

A live recording keeps two sets of rows in its metadata: the flight
recorder's for the window (``FLIGHT_RECORDER_KEY``, see
``opscope.collect.job.flight_recorder``) and the process-group calls of the job's
Python (``PROCESS_GROUP_CALLS_KEY``, ``opscope.collect.job.process_group_calls``).
The recorder notes a collective while its dispatcher op (``c10d::allreduce_``)
runs on the calling thread, and a call's row spans the dispatcher op it made,
so each row belongs to the op of its kind whose span meets the row's (one
time for the recorder, entered to returned for a call); rows and ops are both
in issue order, so one pass per kind pairs them. A row with no such op (made
outside the window's ops) and an op with no row (the recorder's buffer, 2000
collectives by default, wrapped) stay apart: that op has no facts. The
recorder's facts win; a call gives what they lack (the call site), and all
of a point-to-point op on gloo, which the recorder does not keep. A group's
member ranks come from ``distributedInfo.pg_config``.

>>> from opscope.model.records import RECORD_DTYPE, RawSession
>>> records = np.zeros(2, RECORD_DTYPE)
>>> records["start_ns"], records["end_ns"] = [10, 30], [20, 40]
>>> table = EventTable.from_raw(RawSession(records, [], [], ["c10d::allreduce_"], 0, 50, 0))
>>> rows = [["0", 4, "gloo:all_reduce", 11], ["1", 1, "gloo:all_reduce", 31, "sub", 8, 8,
...          "Float", "t.py(3): f", False]]
>>> meta = {"opscopeFlightRecorder": json.dumps(rows),
...         "distributedInfo": '{"pg_config": [{"pg_name": "1", "ranks": [0, 1]}]}'}
>>> facts = flight_facts(table, meta, 0)
>>> facts[0].pg, facts[0].seq, facts[1].pg_ranks, facts[1].nbytes
('0', 4, (0, 1), 32)
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np  # noqa: F401  (the module docstring's example, a doctest, uses np)

from opscope.analysis.collectives import collective_kind, collective_op_rows
from opscope.model.collective_facts import CollectiveFacts
from opscope.model.events import EventTable
from opscope.model.torch_names import (DISTRIBUTED_INFO_KEY, FLIGHT_RECORDER_KEY,
                                       PROCESS_GROUP_CALLS_KEY)

# a row created this close outside its op's span still belongs to it (clock conversion)
_SLACK_NS = 20_000


def flight_rows(metadata: Mapping[str, Any],
                key: str = FLIGHT_RECORDER_KEY) -> Optional[List[list]]:
    """The recorder's rows (or the calls', ``key``) in the metadata, or None (absent or
    malformed); a call's row may have no sequence number."""
    text = metadata.get(key)
    if not isinstance(text, str):
        return None
    try:
        rows = json.loads(text)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    good = [r for r in rows if isinstance(r, list) and len(r) >= 4 and isinstance(r[0], str)
            and (type(r[1]) is int or r[1] is None) and type(r[3]) is int
            and isinstance(r[2], str)]
    return good or None


def group_ranks(metadata: Mapping[str, Any]) -> Dict[str, Tuple[int, ...]]:
    """``distributedInfo.pg_config``'s group name -> member ranks, where it lists them."""
    try:
        info = json.loads(metadata.get(DISTRIBUTED_INFO_KEY) or "null")
    except (TypeError, ValueError):
        return {}
    groups = info.get("pg_config") if isinstance(info, dict) else None
    out: Dict[str, Tuple[int, ...]] = {}
    for g in groups if isinstance(groups, list) else []:
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if isinstance(ranks, list) and all(type(r) is int for r in ranks):
            out[str(g.get("pg_name"))] = tuple(ranks)
    return out


def _facts(row: list, ranks: Dict[str, Tuple[int, ...]]) -> CollectiveFacts:
    extra = (row[4:12] + [None] * 8)[:8]  # rows of older opscope versions have 4 fields
    desc, n_in, n_out, dtype, site, p2p, _returned, peer = extra
    src = dst = None
    if p2p is True and type(peer) is int:
        if collective_kind(row[2]) == "send":
            dst = peer
        else:
            src = peer
    return CollectiveFacts(
        row[0], desc if isinstance(desc, str) else None, ranks.get(row[0]), row[1],
        n_in if type(n_in) is int else None, n_out if type(n_out) is int else None,
        dtype if isinstance(dtype, str) else None, site if isinstance(site, str) else None,
        src, dst)


def _paired(table: EventTable, rows: List[list], epoch_offset_ns: int,
            ranks: Dict[str, Tuple[int, ...]]) -> Dict[int, CollectiveFacts]:
    """Op row -> the facts of the row whose time (or span: a call's) meets its span."""
    by_kind: Dict[str, List[list]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r[3]):
        kind = collective_kind(row[2])
        if kind is not None:
            by_kind[kind].append(row)
    out: Dict[int, CollectiveFacts] = {}
    for kind, ops in collective_op_rows(table).items():
        starts = table.start_ns[ops] + epoch_offset_ns - _SLACK_NS
        ends = table.end_ns[ops] + epoch_offset_ns + _SLACK_NS
        i = 0
        for row in by_kind.get(kind, []):
            last = row[10] if len(row) > 10 and type(row[10]) is int else row[3]
            while i < len(ops) and ends[i] < row[3]:
                i += 1
            if i == len(ops):
                break
            if starts[i] <= last:
                out[int(ops[i])] = _facts(row, ranks)
                i += 1
    return out


def flight_facts(table: EventTable, metadata: Mapping[str, Any],
                 epoch_offset_ns: int) -> Dict[int, CollectiveFacts]:
    """Row -> facts of the dispatcher ops the rows belong to (module docstring)."""
    flights = flight_rows(metadata)
    calls = flight_rows(metadata, PROCESS_GROUP_CALLS_KEY)
    if not flights and not calls:
        return {}
    ranks = group_ranks(metadata)
    out = _paired(table, calls, epoch_offset_ns, ranks) if calls else {}
    for op, facts in (_paired(table, flights, epoch_offset_ns, ranks) if flights else {}).items():
        call = out.get(op)
        if call is not None:
            facts = replace(facts, call_site=facts.call_site or call.call_site,
                            src_rank=call.src_rank, dst_rank=call.dst_rank)
        out[op] = facts
    return {op: f for op, f in out.items() if f.pg is not None or f.seq is not None}
