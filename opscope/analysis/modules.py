"""Module view of a session recorded with ``with_modules=True``.

Which events are module ranges and which module call each event belongs to are
per-event facts, computed once per session: ``opscope.analysis.facts.module_ranges``
and ``event_modules`` (how: ``opscope.analysis.module_owners``). Here:

- *Which module is each event in?* :func:`module_hierarchy`, its ``Module Hierarchy``.
- *How do modules compare?* :func:`module_rows`: one :class:`ModuleRow` per module,
  as a tree of call paths (a module called from two places is two rows), with
  forward and backward time, their sum, self time, calls, parameters, FLOPs and,
  when the session has per-event memory, memory.
- *Which kernels ran several modules' code?* :func:`fused_kernel_counts`: the compiled
  kernels fused from nodes of several modules, each counted for one by the majority
  rule (``opscope.analysis.compiled_modules``); the module table says so under it.
- The notes under a module table and the report's Modules view, written once here:
  ``MEMORY_NOTE`` and :func:`fused_note`.

Example (times in ns; a Net range holding an fc range holding an addmm)::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.modules import ModuleInfo
    >>> from opscope.model.records import (NO_INPUTS, SCOPE_FUNCTION, SCOPE_USER, RawSession,
    ...                                   records_from_rows)
    >>> rows = [(0, 100_000, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
    ...         (10_000, 60_000, -1, 1, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
    ...         (20_000, 50_000, -1, 2, 0, 0, 1, NO_INPUTS, SCOPE_FUNCTION, 0, 0)]
    >>> modules = {"Net": ModuleInfo.for_module("", "Net", "Net", 6),
    ...            "fc (Linear)": ModuleInfo.for_module("fc", "Linear", "Net", 6)}
    >>> s = build_session(RawSession(records_from_rows(rows), [], [1],
    ...                   ["Net", "fc (Linear)", "aten::addmm"], 0, 100_000, 0, modules=modules))
    >>> module_hierarchy(s)
    ['Net', 'Net.fc', 'Net.fc']
    >>> [(r.key, r.depth, r.forward_time_total, r.self_cpu_time_total) for r in module_rows(s)]
    [('Net', 0, 100.0, 50.0), ('fc (Linear)', 1, 50.0, 50.0)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.analysis.ancestry import nearest_marked, nearest_marked_ancestor
from opscope.analysis.autograd_links import backward_marks
from opscope.analysis.facts import event_modules, module_ranges
from opscope.model.session import ProfileSession
from opscope.model.torch_names import COMPILED_CALL_PREFIX

MEMORY_NOTE = ("Net CPU Mem: bytes allocated minus freed by the module's forward and backward "
               "ops, submodules included (what backward frees of forward's cancels out, so "
               "a submodule can exceed its parent); the op table's CPU Mem of the module's "
               "range counts its forward only.")
FUSED_NOTE = ("Fused kernels: {calls} call{s} of {kernels} compiled kernel{ks} ran FX nodes "
              "of several modules; each counts for the module holding most of its nodes "
              "(the majority rule). FunctionEvent.fused_modules and the trace's "
              "\"Fused Modules\" arg name them all.")


def fused_note(calls: int, kernels: int) -> str:
    """The note on fused kernels under a module table ('' when there were none).

    >>> fused_note(4, 2)[:62]
    'Fused kernels: 4 calls of 2 compiled kernels ran FX nodes of s'
    >>> fused_note(0, 0)
    ''
    """
    if calls <= 0:
        return ""
    return FUSED_NOTE.format(calls=calls, s="" if calls == 1 else "s", kernels=kernels,
                             ks="" if kernels == 1 else "s")


def event_memory_bytes(session: ProfileSession) -> Optional[np.ndarray]:
    """MEMORY HOOK: per-event self CPU memory in bytes, or None when not recorded.

    The module view sums this per module (``cpu_memory_usage`` inclusive,
    ``self_cpu_memory_usage`` direct). It reads ``session.self_cpu_memory``
    (an int64 array aligned with the table) when memory profiling provides it.
    """
    memory = getattr(session, "self_cpu_memory", None)
    if memory is None or len(memory) != len(session.table):
        return None
    return np.asarray(memory, dtype=np.int64)


def module_hierarchy(session: ProfileSession) -> List[str]:
    """Per event, the ``Module Hierarchy`` of its module (``Model.encoder.0``), or ''.

    Computed once per session from ``facts.event_modules``; do not edit the list.
    """
    return session.derived("module_hierarchy", _module_hierarchy)


def _module_hierarchy(session: ProfileSession) -> List[str]:
    owner = event_modules(session)
    if not session.modules:
        return [""] * len(owner)
    table = session.table
    by_id = {table.symbols.id_of(name): info.hierarchy for name, info in session.modules.items()}
    names = table.name_id
    return ["" if o < 0 else by_id.get(int(names[o]), "") for o in owner.tolist()]


@dataclass
class ModuleRow:
    """One module (one call path) of the module view; times in microseconds.

    ``cpu_time_total`` is forward + backward time; ``self_cpu_time_total`` is that
    minus the children's. ``flops`` and memory include the children's.
    ``parent`` is the index of the parent row in the list (-1 for a root).
    """

    key: str
    hierarchy: str
    class_name: str
    depth: int
    parent: int
    count: int = 0
    parameters: int = 0
    forward_time_total: float = 0.0
    backward_time_total: float = 0.0
    self_forward_time_total: float = 0.0
    self_backward_time_total: float = 0.0
    flops: int = 0
    cpu_memory_usage: Optional[int] = None
    self_cpu_memory_usage: Optional[int] = None
    # a device collector's: device time of the kernels its forward and backward ops
    # launched (us), its own and with its submodules'; None: no device recorded
    self_device_time_total: Optional[float] = None
    device_time_total: Optional[float] = None
    children: List[int] = field(default_factory=list)

    @property
    def cpu_time_total(self) -> float:
        """Forward plus backward time, in us."""
        return self.forward_time_total + self.backward_time_total

    @property
    def self_cpu_time_total(self) -> float:
        """Forward plus backward self time (the children's left out), in us."""
        return self.self_forward_time_total + self.self_backward_time_total

    @property
    def cpu_time(self) -> float:
        """Average forward + backward time per call."""
        return self.cpu_time_total / self.count if self.count else 0.0


def module_rows(session: ProfileSession, flops: Optional[np.ndarray] = None,
                memory: Optional[np.ndarray] = None) -> List[ModuleRow]:
    """The module tree, one row per call path, parents before children (depth first).

    ``flops`` defaults to ``session.flops`` and ``memory`` to
    :func:`event_memory_bytes`; both are per-event arrays aligned with the table.
    """
    table = session.table
    is_module = module_ranges(session)
    rows_idx = np.flatnonzero(is_module)
    if len(rows_idx) == 0:
        return []
    flops = session.flops if flops is None else flops
    memory = event_memory_bytes(session) if memory is None else memory
    owner = event_modules(session)
    call_parent = nearest_marked_ancestor(table.parent, is_module)

    in_backward = _compiled_backward_ranges(session, is_module)
    groups, group_of = _call_path_groups(session, rows_idx, call_parent, in_backward)
    dur_us = table.duration_ns / 1000.0
    n_groups = len(groups)
    event_group = np.full(len(table), -1, dtype=np.int64)
    has_owner = owner >= 0
    lookup = np.full(len(table), -1, dtype=np.int64)
    lookup[list(group_of)] = list(group_of.values())
    event_group[has_owner] = lookup[owner[has_owner]]
    attributed = event_group >= 0

    def direct_sums(weights: np.ndarray, mask: np.ndarray) -> np.ndarray:
        keep = attributed & mask
        return np.bincount(event_group[keep], weights=weights[keep], minlength=n_groups)

    nodes, wrappers = backward_marks(table)
    marked = nodes | wrappers
    outermost = marked & (nearest_marked_ancestor(table.parent, marked) < 0)
    backward_direct = direct_sums(dur_us, outermost)
    if in_backward.any():
        _move_compiled_backward(table, in_backward, outermost, lookup, event_group,
                                dur_us, backward_direct)
    flops_direct = (direct_sums(flops.astype(np.float64), np.ones(len(table), bool))
                    if flops is not None else np.zeros(n_groups))
    memory_direct = (direct_sums(memory.astype(np.float64), np.ones(len(table), bool))
                     if memory is not None else None)
    device_direct = (direct_sums(_own_device_us(session), np.ones(len(table), bool))
                     if session.device is not None else None)

    for g in reversed(range(n_groups)):  # children have larger indices than parents
        row = groups[g]
        row.self_backward_time_total = float(backward_direct[g])
        row.backward_time_total += row.self_backward_time_total
        row.flops += int(flops_direct[g])
        if memory_direct is not None:
            row.self_cpu_memory_usage = int(memory_direct[g])
            row.cpu_memory_usage = (row.cpu_memory_usage or 0) + row.self_cpu_memory_usage
        if device_direct is not None:
            row.self_device_time_total = float(device_direct[g])
            row.device_time_total = (row.device_time_total or 0.0) + row.self_device_time_total
        child_forward = sum(groups[c].forward_time_total for c in row.children)
        row.self_forward_time_total = row.forward_time_total - child_forward
        if row.parent >= 0:
            up = groups[row.parent]
            up.backward_time_total += row.backward_time_total
            up.flops += row.flops
            if memory_direct is not None:
                up.cpu_memory_usage = (up.cpu_memory_usage or 0) + (row.cpu_memory_usage or 0)
            if device_direct is not None:
                up.device_time_total = (up.device_time_total or 0.0) + row.device_time_total
    return _depth_first(groups)


def fused_kernel_counts(session: ProfileSession) -> Tuple[int, int]:
    """(calls, distinct kernels) of the compiled kernels fused from nodes of several
    modules (``session.fused_modules``).

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> fused_kernel_counts(build_session(RawSession.empty()))
    (0, 0)
    """
    rows = list(session.fused_modules)
    return len(rows), len({int(session.table.name_id[r]) for r in rows})


def _own_device_us(session: ProfileSession) -> np.ndarray:
    """Per event, the device time (us) of the work it launched itself."""
    from opscope.analysis.device import session_device_times

    return session_device_times(session)[0] / 1000.0


def _compiled_backward_ranges(session: ProfileSession, is_module: np.ndarray) -> np.ndarray:
    """The module ranges that analysis.compiled_modules put inside a compiled backward graph's
    call: they hold backward time of a module's call path, and are no calls of it."""
    table = session.table
    calls = table.named_like(COMPILED_CALL_PREFIX)
    if not calls.any() or not is_module.any():
        return np.zeros(len(table), dtype=bool)
    in_graph = nearest_marked_ancestor(table.parent, calls) >= 0
    nodes, wrappers = backward_marks(table)
    in_region = nearest_marked(table.parent, nodes | wrappers) >= 0
    return is_module & in_graph & in_region


def _move_compiled_backward(table: Any, in_backward: np.ndarray, outermost: np.ndarray,
                            lookup: np.ndarray, event_group: np.ndarray, dur_us: np.ndarray,
                            backward_direct: np.ndarray) -> None:
    """Backward time inside compiled backward graphs, from the node's module (the one
    that called the compiled forward) to the modules of the kernels, each its own part."""
    rows = np.flatnonzero(in_backward)
    up = nearest_marked_ancestor(table.parent, in_backward)[rows]
    child = np.zeros(len(table))
    np.add.at(child, up[up >= 0], dur_us[rows[up >= 0]])
    groups = lookup[rows]
    ok = groups >= 0
    np.add.at(backward_direct, groups[ok], dur_us[rows[ok]] - child[rows[ok]])
    outer = rows[up < 0]
    region_group = event_group[nearest_marked(table.parent, outermost)[outer]]
    moved = region_group >= 0
    np.add.at(backward_direct, region_group[moved], -dur_us[outer[moved]])


def _call_path_groups(session: ProfileSession, rows_idx: np.ndarray, call_parent: np.ndarray,
                      in_backward: np.ndarray) -> Tuple[List[ModuleRow], Dict[int, int]]:
    """One row per call path of the module ranges (forward time and calls summed), and the
    group of each module range row (a compiled backward graph's: no call, no forward time)."""
    table = session.table
    group_of: Dict[int, int] = {}
    groups: List[ModuleRow] = []
    paths: Dict[Tuple[int, int], int] = {}  # (parent group, name id) -> group
    infos = session.modules
    dur_us = table.duration_ns / 1000.0
    for row in rows_idx.tolist():  # table order: a parent call before its children
        parent_group = group_of.get(int(call_parent[row]), -1)
        key = (parent_group, int(table.name_id[row]))
        g = paths.get(key)
        if g is None:
            name = table.name(row)
            info = infos.get(name)
            depth = groups[parent_group].depth + 1 if parent_group >= 0 else 0
            g = paths[key] = len(groups)
            groups.append(ModuleRow(name, info.hierarchy if info else name,
                                    info.class_name if info else "", depth, parent_group,
                                    parameters=info.parameters if info else 0))
            if parent_group >= 0:
                groups[parent_group].children.append(g)
        group_of[row] = g
        if not in_backward[row]:
            groups[g].count += 1
            groups[g].forward_time_total += float(dur_us[row])
    return groups, group_of


def _depth_first(groups: List[ModuleRow]) -> List[ModuleRow]:
    """Rows reordered parents-first, each subtree contiguous; indices remapped."""
    order: List[int] = []
    stack = [g for g in range(len(groups)) if groups[g].parent < 0][::-1]
    while stack:
        g = stack.pop()
        order.append(g)
        stack.extend(reversed(groups[g].children))
    new_index = {old: new for new, old in enumerate(order)}
    out = [groups[g] for g in order]
    for row in out:
        row.parent = new_index.get(row.parent, -1)
        row.children = [new_index[c] for c in row.children]
    return out
