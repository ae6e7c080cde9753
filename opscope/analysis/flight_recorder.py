"""Give a rank's collectives the flight recorder's (process group, sequence number).

A trace recorded with ``TORCH_FR_BUFFER_SIZE`` set carries the recorder's rows
for the window (``FLIGHT_RECORDER_KEY``, see ``opscope.collect.flight_recorder``).
Per kind, the recorder's rows and the trace's collectives are both in issue
order on the calling thread, so the n-th row of a kind is the n-th collective
of that kind. When the counts of a kind differ (a row outside the window, a
collective the trace cut), nothing is keyed and the ordinal rule applies.

>>> from opscope.analysis.collectives import CollectiveCall as C
>>> calls = [C("allreduce", 8, 10, 20, 10), C("allreduce", 8, 30, 40, 10)]
>>> rows = [["0", 4, "gloo:all_reduce", 11], ["1", 1, "gloo:all_reduce", 31]]
>>> [(c.pg, c.seq) for c in keyed_calls(calls, rows)]
[('0', 4), ('1', 1)]
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from typing import Any, Dict, List, Optional

from opscope.analysis.collectives import CollectiveCall, collective_kind
from opscope.model.session import ProfileSession
from opscope.model.torch_names import FLIGHT_RECORDER_KEY, POINT_TO_POINT_KINDS


def flight_rows(session: ProfileSession) -> Optional[List[list]]:
    """The recorder's rows in the trace's metadata, or None (absent or malformed)."""
    text = session.metadata.get(FLIGHT_RECORDER_KEY)
    if not isinstance(text, str):
        return None
    try:
        rows = json.loads(text)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    good = [r for r in rows if isinstance(r, list) and len(r) == 4
            and type(r[1]) is int and type(r[3]) is int and isinstance(r[2], str)]
    return good or None


def keyed_calls(calls: List[CollectiveCall], rows: Optional[List[list]]
                ) -> List[CollectiveCall]:
    """``calls`` with ``pg`` and ``seq`` from ``rows`` where each kind's counts agree."""
    if not rows:
        return calls
    by_kind: Dict[str, List[list]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r[3]):
        kind = collective_kind(row[2])
        if kind is not None and kind not in POINT_TO_POINT_KINDS:
            by_kind[kind].append(row)
    positions: Dict[str, List[int]] = defaultdict(list)
    for i, call in enumerate(calls):
        if call.kind not in POINT_TO_POINT_KINDS:
            positions[call.kind].append(i)
    out: List[Any] = list(calls)
    for kind, where in positions.items():
        kind_rows = by_kind.get(kind, [])
        if len(kind_rows) != len(where):
            continue
        for i, row in zip(where, kind_rows):
            out[i] = dataclasses.replace(calls[i], pg=str(row[0]), seq=row[1])
    return out
