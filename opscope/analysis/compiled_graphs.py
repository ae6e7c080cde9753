"""One row per torch.compile'd graph: calls, time, kernels, and how much of it opscope placed.

Each ``## Call CompiledFxGraph <key> ##`` range is one call of one graph. Per graph:
whether it is a forward or a backward graph (a backward one runs inside
``CompiledFunctionBackward``), the Dynamo frame that runs it (its ``Torch-Compiled Region:
<frame>/<compile>`` range; a backward graph's is its forward's, linked by autograd's
sequence number, ``call_regions``) and, with stacks, the program line that called it; its calls and
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

import json
from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

from opscope.analysis.ancestry import nearest_marked, nearest_marked_ancestor
from opscope.analysis.autograd_links import forward_ops
from opscope.analysis.compiled_modules import is_torch_frame
from opscope.analysis.modules import module_hierarchy
from opscope.model.events import EventTable
from opscope.model.session import ProfileSession
from opscope.model.torch_names import (COMPILED_BACKWARD, COMPILED_CALL_PREFIX,
                                       COMPILED_FORWARD, COMPILED_FRAME_PREFIX,
                                       GRAPH_BREAKS_KEY, compiled_graph_key)

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


def named(table: EventTable, name: str) -> np.ndarray:
    """Per event: True where its name is exactly ``name``."""
    sid = table.symbols.id_of(name)
    return np.zeros(len(table), dtype=bool) if sid is None else table.name_id == sid


def call_regions(table: EventTable) -> np.ndarray:
    """Per event, the row of the Dynamo frame region (``Torch-Compiled Region``) it runs
    for, or -1: a forward event's nearest region above it; an event in (or of) a
    ``CompiledFunctionBackward`` its forward ``CompiledFunction``'s region, found by
    autograd's sequence number and forward thread (``analysis.autograd_links``)."""
    region_of = nearest_marked_ancestor(table.parent, table.named_like(COMPILED_FRAME_PREFIX))
    is_backward = named(table, COMPILED_BACKWARD)
    backward = np.flatnonzero(is_backward)
    if not len(backward):
        return region_of
    forward = forward_ops(table, backward, named(table, COMPILED_FORWARD))
    region_of_backward = np.full(len(table), -1, dtype=np.int64)
    region_of_backward[backward] = np.where(forward >= 0, region_of[np.maximum(forward, 0)], -1)
    backward_of = nearest_marked(table.parent, is_backward)
    inside = backward_of >= 0
    out = region_of.copy()
    out[inside] = region_of_backward[backward_of[inside]]
    return out


def compile_id(region_name: str) -> str:
    """The compile id of a ``Torch-Compiled Region: 0/1`` range name.

    >>> compile_id("Torch-Compiled Region: 0/1")
    '0/1'
    """
    return region_name[len(COMPILED_FRAME_PREFIX):].strip(": ")


def graph_rows(session: ProfileSession) -> List[GraphRow]:
    """The session's compiled graphs, in the order of their first call."""
    table = session.table
    is_call = table.named_like(COMPILED_CALL_PREFIX)
    if not is_call.any():
        return []
    call_of = nearest_marked_ancestor(table.parent, is_call)
    region_of = call_regions(table)
    backward_of = nearest_marked_ancestor(table.parent, table.named_like(COMPILED_BACKWARD))
    hierarchy = module_hierarchy(session) if session.modules else None
    rows: Dict[str, GraphRow] = {}
    kernels: Dict[str, set] = {}
    for row in np.flatnonzero(is_call).tolist():
        key = compiled_graph_key(table.name(row))
        graph = rows.get(key)
        if graph is None:
            frame = compile_id(table.name(int(region_of[row]))) if region_of[row] >= 0 else ""
            graph = rows[key] = GraphRow(
                key, "backward" if backward_of[row] >= 0 else "forward", frame,
                caller_line(session, row))
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


def caller_line(session: ProfileSession, row: int) -> str:
    """The innermost frame of the program (not torch's) in the call's stack, or ''."""
    stacks = session.stacks
    frames = stacks[row] if stacks is not None and row < len(stacks) else None
    return next((f for f in frames or () if not is_torch_frame(f)), "")


def metadata_json(session: ProfileSession, key: str) -> Dict[str, Any]:
    """The JSON object kept under ``key`` in the session's metadata; {} if absent or bad."""
    text = session.metadata.get(key)
    try:
        value = json.loads(text) if isinstance(text, str) and len(text) < 1_000_000 else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def graph_breaks(session: ProfileSession) -> Dict[str, int]:
    """Dynamo's graph breaks so far in the recording process: reason -> count ({} if none)."""
    value = metadata_json(session, GRAPH_BREAKS_KEY)
    return {str(k)[:500]: int(v) for k, v in value.items() if isinstance(v, int)}
