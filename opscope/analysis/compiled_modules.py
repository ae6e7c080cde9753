"""Inside torch.compile'd graphs: each kernel's modules (as module ranges) and source lines.

A live recording of compiled code holds, per ``## Call CompiledFxGraph <key> ##``
range, the call sites Inductor noted for that graph (``raw.compiled_sites``, from
``opscope.collect.inductor_sites``): the op each site shows as, the modules of its
FX nodes, and their source lines. ``with_compiled_modules(raw)`` matches the ops
recorded inside each call with the sites, in order (the k-th ``aten::addmm`` in the
call is the k-th ``aten::addmm`` site), and then:

- **modules** (``with_modules``): adds module ranges inside the call, as the module
  hooks would have recorded them in eager mode, named as they are (``0.fc1 (Linear)``)
  and nested under the modules around the call. A backward graph's kernels get ranges
  of the forward modules they differentiate (the forward call is the one whose
  ``CompiledFunction`` has the backward's sequence number); ``analysis.modules`` counts
  those as backward time, not as calls. A kernel fused from nodes of several modules
  counts for the module that holds most of its nodes (the *majority* rule), and
  ``raw.fused_modules`` names them all, with their node counts (``_fused_counts``);
- **source lines** (``with_stack``): a kernel's stack is the model source Dynamo
  recorded for its nodes (``file(line): function``), not Inductor's generated wrapper.

A call whose ops do not match its sites (a graph compiled before opscope was
imported, a C++ wrapper, control flow) stays at graph level, with one warning per graph.

Example::

    >>> from opscope.model.records import RawSession
    >>> with_compiled_modules(RawSession.empty()).records.shape
    (0,)
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from opscope.model.modules import ModuleInfo, fused_module_entries
from opscope.model.records import (FLAG_SOURCE_STACK, NO_INPUTS, NO_STACK, RECORD_DTYPE,
                                   SCOPE_USER, RawSession)
from opscope.model.torch_names import (COMPILED_BACKWARD, COMPILED_CALL_PREFIX,
                                       COMPILED_FORWARD, compiled_graph_key)

MAX_PAD_NS = 16  # a module range is widened by (16 - depth) ns, so it nests around its ops
_warned: set = set()


@dataclasses.dataclass
class _Call:
    row: int
    name: str
    matched: List[Tuple[int, Any]]  # (record row, site), in start order
    context: List[str] = dataclasses.field(default_factory=list)  # module names around it
    backward: bool = False  # a backward graph: its context is its forward call's


def with_compiled_modules(raw: RawSession) -> RawSession:
    """``raw`` with module ranges and kernel stacks inside compiled graphs (see above)."""
    if not raw.compiled_sites or len(raw.records) == 0:
        return raw
    order = np.lexsort((-raw.records["end_ns"], raw.records["start_ns"]))  # start, outer first
    calls = _matched_calls(raw, order)
    if not calls:
        return raw
    stack_ids, stack_table = _kernel_stacks(raw, calls, order)
    raw = dataclasses.replace(raw, stack_ids=stack_ids, stack_table=stack_table)
    if raw.modules is None:
        return raw
    return dataclasses.replace(raw, **_module_ranges(raw, calls))


def _matched_calls(raw: RawSession, order: np.ndarray) -> List[_Call]:
    rec = raw.records
    names = raw.names
    call_ids = {i: names[i] for i in range(len(names))
                if names[i].startswith(COMPILED_CALL_PREFIX) and names[i] in raw.compiled_sites}
    if not call_ids:
        return []
    is_call = np.isin(rec["name_id"], list(call_ids))
    calls = []
    for row in order[is_call[order]].tolist():
        name = names[int(rec["name_id"][row])]
        matched = _match(raw, order, row, raw.compiled_sites[name])
        if matched is None:
            _warn_once(name)
            continue
        calls.append(_Call(row, name, matched))
    return calls


def _inside(raw: RawSession, order: np.ndarray, row: int) -> np.ndarray:
    """Rows of the records inside record ``row`` on its thread, in start order."""
    rec = raw.records
    start, end = rec["start_ns"][order], rec["end_ns"][order]
    lo = int(np.searchsorted(start, rec["start_ns"][row], side="left"))
    hi = int(np.searchsorted(start, rec["end_ns"][row], side="right"))
    rows = order[lo:hi]
    keep = ((rec["thread_index"][rows] == rec["thread_index"][row])
            & (end[lo:hi] <= rec["end_ns"][row]) & (rows != row))
    return rows[keep]


def _match(raw: RawSession, order: np.ndarray, row: int,
           candidates: Sequence[Optional[list]]) -> Optional[List[Tuple[int, Any]]]:
    """The call's ops paired with one graph's sites, or None when no graph's sites fit."""
    rec = raw.records
    inside = _inside(raw, order, row)
    for sites in candidates:
        if not sites:
            continue
        wanted = {site[0] for site in sites}
        rows, last_end = [], {}
        for r in inside.tolist():
            name = raw.names[int(rec["name_id"][r])]
            if name in wanted and rec["start_ns"][r] >= last_end.get(name, -1):
                rows.append((r, name))
                last_end[name] = int(rec["end_ns"][r])  # an op nested in its namesake: skip
        if [n for _, n in rows] == [site[0] for site in sites]:
            return [(r, site) for (r, _), site in zip(rows, sites)]
    return None


def _warn_once(name: str) -> None:
    key = compiled_graph_key(name)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"opscope: compiled graph {key[:16]}: its kernels are shown at graph level "
                  "only (it was compiled before opscope was imported, or its ops do not "
                  "match the code Inductor generated); import opscope before torch.compile "
                  "runs, or use `opscope run`", RuntimeWarning, stacklevel=2)


def _kernel_stacks(raw: RawSession, calls: List[_Call], order: np.ndarray
                   ) -> Tuple[Optional[np.ndarray], Optional[List[List[str]]]]:
    """With ``with_stack``: each matched op's stack is its nodes' model source."""
    if raw.stack_ids is None or raw.stack_table is None:
        return raw.stack_ids, raw.stack_table
    stack_ids = raw.stack_ids.copy()
    flags = raw.records["flags"]
    table = list(raw.stack_table)
    index: Dict[Tuple[str, ...], int] = {}
    for call in calls:
        caller = _caller_frames(raw, call.row)
        for row, site in call.matched:
            frames = tuple(site[2]) or caller
            if not frames:
                continue
            if frames not in index:
                index[frames] = len(table)
                table.append(list(frames))
            rows = np.append(_inside(raw, order, row), row)  # an extern call's own ops too
            stack_ids[rows] = index[frames]
            flags[rows] |= FLAG_SOURCE_STACK
    return stack_ids, table


def _caller_frames(raw: RawSession, row: int) -> Tuple[str, ...]:
    """The program's frames around a graph call (torch's own left out): the stack of a
    kernel whose nodes Dynamo recorded no source line for (code inside torch.nn)."""
    sid = int(raw.stack_ids[row]) if raw.stack_ids is not None else NO_STACK
    if sid < 0 or raw.stack_table is None or sid >= len(raw.stack_table):
        return ()
    return tuple(f for f in raw.stack_table[sid] if not is_torch_frame(f))


def is_torch_frame(frame: str) -> bool:
    """True for a frame of torch's own code or of Inductor's generated modules.

    >>> is_torch_frame("/venv/site-packages/torch/nn/modules/module.py(1775): _call_impl")
    True
    """
    path = frame.replace("\\", "/")
    return "/torch/" in path or path.startswith("torch/") or "torchinductor" in path


def _site_modules(site: Any) -> List[Tuple[str, str]]:
    """The modules below the compiled root that a site counts for, outermost first.

    The *majority* rule, for a kernel fused from nodes of several modules: from the root,
    go into the submodule that holds more than half of the site's nodes (those with a
    module), and stop where none does. A fused ``layer_norm + relu`` of 10 LayerNorm nodes
    and 1 ReLU node counts for the LayerNorm; a kernel split evenly between two blocks
    counts for their parent.

    >>> _site_modules(("k", ((10, (("", "M"), ("0", "B"), ("0.ln", "LN"))),
    ...                      (1, (("", "M"), ("0", "B")))), ()))
    [('0', 'B'), ('0.ln', 'LN')]
    """
    weighted = [(int(n), list(stack)[1:]) for n, stack in site[1] if stack]
    total = sum(n for n, _ in weighted)
    chosen: List[Tuple[str, str]] = []
    depth = 0
    while total:
        held: Dict[Tuple[str, str], int] = {}
        for n, stack in weighted:
            if len(stack) > depth and stack[:depth] == chosen:
                held[stack[depth]] = held.get(stack[depth], 0) + n
        best = max(held.items(), key=lambda item: item[1], default=None)
        if best is None or 2 * best[1] <= total:
            break
        chosen.append(best[0])
        depth += 1
    return chosen


def _module_ranges(raw: RawSession, calls: List[_Call]) -> Dict[str, Any]:
    """New records (module ranges), names and ModuleInfos for the matched calls."""
    modules: Dict[str, ModuleInfo] = dict(raw.modules or {})
    _call_contexts(raw, calls, modules)
    names = list(raw.names)
    name_ids = {n: i for i, n in enumerate(names)}
    rows: List[Tuple] = []
    fused = dict(raw.fused_modules)
    for call in calls:
        rows.extend(_call_ranges(raw, call, modules, names, name_ids, fused))
    if not rows:
        return dict(fused_modules=fused)
    new = np.array(rows, dtype=RECORD_DTYPE)
    records = np.concatenate([new, raw.records])  # first: a range before its namesake span
    extra: Dict[str, Any] = dict(records=records, names=names, modules=modules,
                                 fused_modules={len(new) + r: v for r, v in fused.items()})
    if raw.stack_ids is not None:
        extra["stack_ids"] = np.concatenate([np.full(len(new), NO_STACK, raw.stack_ids.dtype),
                                             raw.stack_ids])
    if raw.flops is not None:
        extra["flops"] = np.concatenate([np.zeros(len(new), raw.flops.dtype), raw.flops])
    if raw.correlation is not None:
        extra["correlation"] = np.concatenate([np.zeros(len(new), raw.correlation.dtype),
                                               raw.correlation])
    return extra


def _call_ranges(raw: RawSession, call: _Call, modules: Dict[str, ModuleInfo],
                 names: List[str], name_ids: Dict[str, int],
                 fused: Dict[int, Tuple[str, ...]]) -> List[Tuple]:
    """The module range records of one call: a stack of open ranges over its ops.

    A kernel fused from nodes of several modules goes into ``fused`` (record -> them).
    """
    rec = raw.records
    context = [m for m in call.context if m in modules]
    prefix = modules[context[-1]].path if context else ""
    root_class = modules[context[0]].class_name if context else _site_root(call)
    thread = int(rec["thread_index"][call.row])
    rf_thread = int(rec["rf_thread_id"][call.row])
    lo, hi = int(rec["start_ns"][call.row]), int(rec["end_ns"][call.row])
    opened: List[List[Any]] = []  # [name, start, end]
    out: List[Tuple] = []

    def close(entry: List[Any], depth: int) -> None:
        pad = max(MAX_PAD_NS - depth, 1)
        start, end = max(entry[1] - pad, lo + 1), min(entry[2] + pad, hi - 1)
        out.append((start, end, -1, name_ids[entry[0]], thread, 0, rf_thread, NO_INPUTS,
                    SCOPE_USER, 0, 0))

    for row, site in call.matched:
        chain = list(context) if call.backward else []
        for path, cls in _site_modules(site):
            full = f"{prefix}.{path}" if prefix else path
            name = f"{full} ({cls})"
            info = modules.setdefault(name, ModuleInfo.for_module(
                full, cls, root_class, raw.compiled_module_params.get(name, 0)))
            chain.append(info.name)
        counts = _fused_counts(site, prefix, context[-1] if context else root_class)
        if counts:
            fused[row] = fused_module_entries(counts)
        start, end = int(rec["start_ns"][row]), int(rec["end_ns"][row])
        keep = 0
        while keep < min(len(opened), len(chain)) and opened[keep][0] == chain[keep]:
            keep += 1
        while len(opened) > keep:
            close(opened.pop(), len(opened))
        for entry in opened:
            entry[2] = end
        for name in chain[keep:]:
            if name not in name_ids:
                name_ids[name] = len(names)
                names.append(name)
            opened.append([name, start, end])
    while opened:
        close(opened.pop(), len(opened))
    return out


def _fused_counts(site: Any, prefix: str, root_name: str) -> List[Tuple[str, int]]:
    """(module name, FX nodes) of each module a site's nodes came from, most nodes first;
    [] unless there are several. A node's module is the innermost of its stack; the
    module ranges are named as ``_call_ranges`` names them (under ``prefix``).

    >>> _fused_counts(("k", ((10, (("", "M"), ("0", "B"), ("0.ln", "LN"))),
    ...                      (1, (("", "M"), ("0", "B")))), ()), "", "M")
    [('0.ln (LN)', 10), ('0 (B)', 1)]
    """
    counts: Dict[str, int] = {}
    for n, stack in site[1]:
        if not stack:
            continue
        name = root_name
        if len(stack) > 1:
            path, cls = stack[-1]
            name = ModuleInfo.for_module(f"{prefix}.{path}" if prefix else path, cls, "").name
        counts[name] = counts.get(name, 0) + int(n)
    if len(counts) < 2:
        return []
    return sorted(counts.items(), key=lambda item: -item[1])


def _site_root(call: _Call) -> str:
    """The compiled root's class, as its nodes' module stacks name it."""
    for _, site in call.matched:
        for _, stack in site[1]:
            if stack and stack[0][1]:
                return str(stack[0][1])
    return ""


def _call_contexts(raw: RawSession, calls: List[_Call], modules: Dict[str, ModuleInfo]) -> None:
    """Each call's module ranges around it; a backward call takes its forward call's."""
    rec = raw.records
    names = raw.names
    range_ids = [i for i, n in enumerate(names) if n in modules]
    fwd_id = names.index(COMPILED_FORWARD) if COMPILED_FORWARD in names else -1
    bwd_id = names.index(COMPILED_BACKWARD) if COMPILED_BACKWARD in names else -1
    is_module = np.isin(rec["name_id"], range_ids) & (rec["scope"] == SCOPE_USER)
    marked = np.flatnonzero(is_module | (rec["name_id"] == fwd_id) | (rec["name_id"] == bwd_id))
    by_seq: Dict[int, List[str]] = {}
    last: List[str] = []
    for call in sorted(calls, key=lambda c: int(rec["start_ns"][c.row])):
        row = call.row
        around = marked[(rec["thread_index"][marked] == rec["thread_index"][row])
                        & (rec["start_ns"][marked] <= rec["start_ns"][row])
                        & (rec["end_ns"][marked] >= rec["end_ns"][row])]
        around = around[np.argsort(rec["start_ns"][around], kind="stable")]
        context = [names[int(rec["name_id"][r])] for r in around if is_module[r]]
        graph_ranges = [r for r in around.tolist() if not is_module[r]]
        inner = graph_ranges[-1] if graph_ranges else -1
        seq = int(rec["seq_nr"][inner]) if inner >= 0 else -1
        if inner >= 0 and int(rec["name_id"][inner]) == bwd_id:
            call.backward = True
            call.context = by_seq.get(seq, last)
            continue
        call.context = context
        last = context
        if seq >= 0:
            by_seq[seq] = context
