"""Give each collective's event the flight recorder's facts: group, number, sizes, call site.

A live recording keeps the recorder's rows for the window in its metadata
(``FLIGHT_RECORDER_KEY``, see ``opscope.collect.flight_recorder``). The recorder
notes a collective while its dispatcher op (``c10d::allreduce_``) runs on the
calling thread, so each row belongs to the op of its kind whose span holds the
row's creation time; rows and ops are both in issue order, so one pass per kind
pairs them. A row with no such op (made outside the window's ops) and an op
with no row (the recorder's buffer, 2000 collectives by default, wrapped) stay
apart: that op has no facts. A group's member ranks come from
``distributedInfo.pg_config``.

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
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from opscope.analysis.collectives import collective_kind, collective_op_rows
from opscope.model.collective_facts import CollectiveFacts
from opscope.model.events import EventTable
from opscope.model.torch_names import DISTRIBUTED_INFO_KEY, FLIGHT_RECORDER_KEY

# a row created this close outside its op's span still belongs to it (clock conversion)
_SLACK_NS = 20_000


def flight_rows(metadata: Mapping[str, Any]) -> Optional[List[list]]:
    """The recorder's rows in the trace's metadata, or None (absent or malformed)."""
    text = metadata.get(FLIGHT_RECORDER_KEY)
    if not isinstance(text, str):
        return None
    try:
        rows = json.loads(text)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    good = [r for r in rows if isinstance(r, list) and len(r) >= 4 and isinstance(r[0], str)
            and type(r[1]) is int and type(r[3]) is int and isinstance(r[2], str)]
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
    extra = (row[4:9] + [None] * 5)[:5]  # rows of older opscope versions have 4 fields
    desc, n_in, n_out, dtype, site = extra
    return CollectiveFacts(
        row[0], desc if isinstance(desc, str) else None, ranks.get(row[0]), row[1],
        n_in if type(n_in) is int else None, n_out if type(n_out) is int else None,
        dtype if isinstance(dtype, str) else None, site if isinstance(site, str) else None)


def flight_facts(table: EventTable, metadata: Mapping[str, Any],
                 epoch_offset_ns: int) -> Dict[int, CollectiveFacts]:
    """Row -> facts of the dispatcher ops the recorder's rows belong to (module docstring)."""
    rows = flight_rows(metadata)
    if not rows:
        return {}
    ranks = group_ranks(metadata)
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
            while i < len(ops) and ends[i] < row[3]:
                i += 1
            if i == len(ops):
                break
            if starts[i] <= row[3]:
                out[int(ops[i])] = _facts(row, ranks)
                i += 1
    return out
