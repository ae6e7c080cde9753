"""The Ranks view's data: a torch.distributed job's per-rank traces as one page.

``opscope.report.data.job_report_data(paths)`` reads the rank traces once each
(``opscope.analysis.ranks.job.load_job``), analyses them as ``opscope ranks``
does (``opscope.analysis.ranks.analyse.analyse_ranks``) and returns the report's data:
the other views show the lowest rank's session (``meta.shown_rank``), and
``ranks`` holds

- ``heatmap``: step time (ms) per rank (rows) and step number (columns),
  ``null`` where a rank did not record that step;
- ``summary``, ``stragglers`` and ``desync``: as ``opscope ranks --json``;
- ``collectives``: the matched collectives, longest wait first (at most
  ``COLLECTIVE_CAP``), with per rank its arrival, wait and transfer (ms) as
  columns aligned with ``ranks``;
- ``timeline``: each window's timeline lanes (``opscope.report.timeline``, the
  cap shared among the windows; a rank profiled in several windows has a group
  for each, and ``ranks`` counts the ranks) with its ``offset_ns`` from the
  job's first event, so all ranks are on one aligned clock.

``ranks_view`` computes ``ranks`` from the job's ``JobReading``: the Ranks view's entry in
the registry (``opscope.report.views``), a view only a job's report has.

Example::

    >>> rows = heatmap({0: StepTimes([1, 2], [0, 5], [4_000_000, 6_000_000]),
    ...                 1: StepTimes([2], [0], [7_500_000])})
    >>> rows["steps"], rows["ms"]
    ([1, 2], [[4.0, 6.0], [None, 7.5]])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from opscope.analysis.ranks.job import RankJob, StepTimes
from opscope.analysis.ranks.facts import clock_offset_ns
from opscope.analysis.ranks.analyse import RanksAnalysis
from opscope.model.session import ProfileSession
from opscope.report.timeline import timeline_lanes

COLLECTIVE_CAP = 2000  # rows of the collective table, longest wait first
STEP_CAP = 2000  # heat map columns: the first steps


def heatmap(steps: Dict[int, StepTimes]) -> Dict[str, Any]:
    """Ranks x step numbers of step times (ms); a step number seen twice keeps its first."""
    numbers = sorted({n for s in steps.values() for n in s.numbers})[:STEP_CAP]
    column = {n: k for k, n in enumerate(numbers)}
    ranks = sorted(steps)
    cells: List[List[Optional[float]]] = []
    for r in ranks:
        row: List[Optional[float]] = [None] * len(numbers)
        for n, dur in zip(steps[r].numbers, steps[r].dur_ns):
            k = column.get(n)
            if k is not None and row[k] is None:
                row[k] = round(dur / 1e6, 3)
        cells.append(row)
    return {"ranks": ranks, "steps": numbers, "ms": cells,
            "total_steps": len({n for s in steps.values() for n in s.numbers})}


def collective_rows(analysis: RanksAnalysis, ranks: List[int]) -> Dict[str, Any]:
    """The collectives, longest wait first, as rows with per-rank columns."""
    ordered = sorted(analysis.collectives, key=lambda c: (-c.max_wait_ms, c.pg, c.seq))
    rows = []
    for c in ordered[:COLLECTIVE_CAP]:
        here = [c.ranks.get(r) for r in ranks]
        arrivals = [a.start_ms for a in here if a is not None]
        last = max(c.ranks, key=lambda r: c.ranks[r].start_ms) if c.ranks else None
        rows.append({
            "pg": c.pg, "seq": c.seq, "kind": c.kind, "bytes": c.bytes,
            "max_wait_ms": c.max_wait_ms, "last_rank": last,
            "spread_ms": round(max(arrivals) - min(arrivals), 3) if arrivals else 0.0,
            "start_ms": [a.start_ms if a else None for a in here],
            "wait_ms": [a.wait_ms if a else None for a in here],
            "transfer_ms": [a.transfer_ms if a else None for a in here],
        })
    return {"ranks": ranks, "rows": rows, "total": len(ordered)}


class _LaneCollector:
    """``load_job``'s visitor: each rank's timeline lanes, capped, with its aligned start."""

    def __init__(self, cap: int):
        self.cap = cap
        self.groups: List[Dict[str, Any]] = []

    def __call__(self, rank: int, path: str, session: ProfileSession) -> None:
        table = session.table
        lanes = timeline_lanes(session, self.cap)
        start = (int(table.base_ns) + session.epoch_offset_ns + clock_offset_ns(session)
                 if len(table) else None)
        self.groups.append({"rank": rank, "file": os.path.basename(path), "start_ns": start,
                            **lanes})

    def merged(self, origin: int) -> Dict[str, Any]:
        """One name table for all ranks; groups by rank (then time), offsets from ``origin``.

        ``origin`` moves earlier when a rank's lanes start before it (a session's
        base time may precede its first event), so no offset is negative.
        """
        names: Dict[str, int] = {}
        origin = min([origin] + [g["start_ns"] for g in self.groups if g["start_ns"] is not None])
        groups = []
        for g in sorted(self.groups, key=lambda g: (g["rank"], g["start_ns"] or 0)):
            remap = [names.setdefault(n, len(names)) for n in g["names"]]
            for lane in g["lanes"]:
                lane["name"] = [remap[k] for k in lane["name"]]
            offset = g["start_ns"] - origin if g["start_ns"] is not None else 0
            groups.append({"rank": g["rank"], "file": g["file"], "offset_ns": offset,
                           "lanes": g["lanes"], "total": g["total"], "shown": g["shown"],
                           "min_dur_ns": g["min_dur_ns"], "window_ns": g["window_ns"]})
        window = max((g["offset_ns"] + g["window_ns"] for g in groups), default=0)
        return {"names": list(names), "groups": groups, "window_ns": window,
                "ranks": len({g["rank"] for g in groups}),  # groups are windows, not ranks
                "total": sum(g["total"] for g in groups),
                "shown": sum(g["shown"] for g in groups), "cap": self.cap * len(groups)}


@dataclass
class JobReading:
    """What a job's views read (``opscope.report.views.ViewInputs.job``): the job, its
    analysis, its ranks' timeline lanes and the job's first event (ns, the lanes' origin)."""

    job: RankJob
    analysis: RanksAnalysis
    lanes: _LaneCollector
    origin_ns: int


def ranks_view(inputs) -> Dict[str, Any]:
    """The Ranks view's data from ``inputs.job`` (a ``JobReading``; see the docstring)."""
    job, analysis = inputs.job.job, inputs.job.analysis
    doc = analysis.to_json()
    return {
        "world_size": analysis.world_size, "missing_ranks": analysis.missing_ranks,
        "summary": [{k: v for k, v in r.items() if k != "files"} for r in doc["ranks"]],
        "heatmap": heatmap(job.steps), "collectives": collective_rows(
            analysis, [f.rank for f in job.facts]),
        "stragglers": doc["stragglers"], "desync": doc["desync"],
        "timeline": inputs.job.lanes.merged(inputs.job.origin_ns),
    }
