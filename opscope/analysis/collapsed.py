"""Collapsed stacks: each distinct path of a session and its summed self time.

A path is the event's Python stack (root first), then the op and range names
enclosing the event (outermost first), then the event itself, joined by
``;``. Frames have spaces replaced by ``_`` (as torch.profiler does,
``frame_text``), so a line ``path value`` keeps the value after the last
space. ``opscope.export.stacks`` writes them for flamegraph.pl and
speedscope; the report's flame graph (``opscope.report.flame``) draws them.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> rows = [(0, 50_000, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0),
    ...         (10_000, 30_000, -1, 1, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)]
    >>> raw = RawSession(records_from_rows(rows), [], [1], ["my step", "aten::mm"],
    ...                  0, 60_000, 0)
    >>> collapsed_stacks(build_session(raw))
    {'my_step': 30000, 'my_step;aten::mm': 20000}
"""

from __future__ import annotations

from typing import Dict, List

from opscope.model.session import ProfileSession

CPU_METRICS = ("self_cpu_time_total",)
DEVICE_METRICS = ("self_cuda_time_total", "self_device_time_total")
METRICS = CPU_METRICS + DEVICE_METRICS


def frame_text(frame: str) -> str:
    """A frame as collapsed stacks can hold it: no spaces, ``;`` or line breaks.

    >>> frame_text("train.py(12): step")
    'train.py(12):_step'
    """
    return (frame.replace(";", ":").replace("\r", " ").replace("\n", " ")
            .replace("\t", " ").replace(" ", "_"))


def collapsed_stacks(session: ProfileSession, metric: str = "self_cpu_time_total") -> Dict[str, int]:
    """Map each distinct path to its summed ``metric`` in ns, first-seen order.

    Raises ``ValueError`` for an unknown metric. Device metrics are zero for
    every event of a CPU session, so they give an empty mapping.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    table = session.table
    if metric in DEVICE_METRICS or len(table) == 0:
        return {}
    names = [frame_text(n) for n in table.symbols.names]
    name_ids = table.name_id.tolist()
    parents = table.parent.tolist()
    values = table.self_ns.tolist()
    stacks = session.stacks
    # parents come before their children in table order: one pass builds each chain
    chains: List[str] = [""] * len(table)
    totals: Dict[str, int] = {}
    for i, (nid, p) in enumerate(zip(name_ids, parents)):
        chain = names[nid] if p < 0 else chains[p] + ";" + names[nid]
        chains[i] = chain
        if values[i] <= 0:
            continue
        frames = stacks[i] if stacks is not None else None
        key = (";".join(frame_text(f) for f in reversed(frames)) + ";" + chain) if frames else chain
        totals[key] = totals.get(key, 0) + values[i]
    return totals
