"""One row per torch.compile'd graph: calls, time, kernels, and how much of it opscope placed.

Each ``## Call CompiledFxGraph <key> ##`` range is one call of one graph. Per graph:
whether it is a forward or a backward graph (a backward one runs inside
``CompiledFunctionBackward``), the Dynamo frame that runs it (its ``Torch-Compiled Region:
<frame>/<compile>`` range) and, with stacks, the program line that called it; its calls and
time; its kernels (generated kernels and extern calls noted by Inductor,
``analysis.compiled_modules``); and the share of the self time inside it that lies in a
module below the root (``with_modules``). Dynamo's graph breaks so far in the process
(reason -> count) come with a live recording's metadata (``GRAPH_BREAKS_KEY``).

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> graph_rows(build_session(RawSession.empty()))
    []
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np

from opscope.analysis.ancestry import nearest_marked_ancestor
from opscope.analysis.compiled_modules import is_torch_frame
from opscope.analysis.modules import module_hierarchy
from opscope.model.session import ProfileSession
from opscope.model.torch_names import (COMPILED_BACKWARD, COMPILED_CALL_PREFIX,
                                       COMPILED_FRAME_PREFIX, GRAPH_BREAKS_KEY,
                                       compiled_graph_key)

KERNEL_PREFIX = "graph_"


@dataclass
class GraphRow:
    """One compiled graph; times in microseconds."""

    key: str
    direction: str  # "forward" or "backward"
    frame: str  # "0/0", or "" when no frame range is around it
    caller: str  # the program's "file(line): function" that called it, or ""
    calls: int = 0
    time_us: float = 0.0
    kernels: int = 0  # distinct generated kernels run inside it
    in_modules_pct: float = 0.0  # of the self time inside it, in modules below the root


def graph_rows(session: ProfileSession) -> List[GraphRow]:
    """The session's compiled graphs, in the order of their first call."""
    table = session.table
    is_call = table.named_like(COMPILED_CALL_PREFIX)
    if not is_call.any():
        return []
    call_of = nearest_marked_ancestor(table.parent, is_call)
    frame_of = nearest_marked_ancestor(table.parent, table.named_like(COMPILED_FRAME_PREFIX))
    backward_of = nearest_marked_ancestor(table.parent, table.named_like(COMPILED_BACKWARD))
    hierarchy = module_hierarchy(session) if session.modules else None
    rows: Dict[str, GraphRow] = {}
    kernels: Dict[str, set] = {}
    for row in np.flatnonzero(is_call).tolist():
        key = compiled_graph_key(table.name(row))
        graph = rows.get(key)
        if graph is None:
            frame = table.name(int(frame_of[row])) if frame_of[row] >= 0 else ""
            graph = rows[key] = GraphRow(
                key, "backward" if backward_of[row] >= 0 else "forward",
                frame[len(COMPILED_FRAME_PREFIX):].strip(": "), _caller(session, row))
            kernels[key] = set()
        graph.calls += 1
        graph.time_us += float(table.duration_ns[row]) / 1000.0
    inside = np.flatnonzero(call_of >= 0)
    placed: Dict[str, List[float]] = {key: [0.0, 0.0] for key in rows}
    for row in inside.tolist():
        key = compiled_graph_key(table.name(int(call_of[row])))
        name = table.name(row)
        if name.startswith(KERNEL_PREFIX):
            kernels[key].add(name)
        self_us = float(table.self_ns[row]) / 1000.0
        placed[key][1] += self_us
        if hierarchy is not None and "." in hierarchy[row]:
            placed[key][0] += self_us
    for key, graph in rows.items():
        graph.kernels = len(kernels[key])
        inside_us, total = placed[key]
        graph.in_modules_pct = 100.0 * inside_us / total if total else 0.0
    return list(rows.values())


def _caller(session: ProfileSession, row: int) -> str:
    """The innermost frame of the program (not torch's) in the call's stack, or ''."""
    stacks = session.stacks
    frames = stacks[row] if stacks is not None and row < len(stacks) else None
    return next((f for f in frames or () if not is_torch_frame(f)), "")


def graph_breaks(session: ProfileSession) -> Dict[str, int]:
    """Dynamo's graph breaks so far in the recording process: reason -> count ({} if none)."""
    import json

    text = session.metadata.get(GRAPH_BREAKS_KEY)
    try:
        value = json.loads(text) if isinstance(text, str) and len(text) < 1_000_000 else {}
    except (ValueError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k)[:500]: int(v) for k, v in value.items() if isinstance(v, int)}
