"""Device work linked to the ops that launched it.

A device collector gives CUDA runtime and driver calls (host side, with a
correlation id and CUPTI's thread id) and the kernels, copies and memsets they
launched (device side, same correlation id). ``with_api_calls`` puts the API
calls among the op records of their host thread, so the tree nests each under
the op that made it, as torch.profiler's ``cudaLaunchKernel`` rows are.
``link_device`` then ties every device event to that call's row and to the
op that owns it: the innermost op or range open on the launching thread, which
is the op torch.profiler pushes its correlation id for. ``device_times`` gives
each row its own device time and its subtree's, as torch's ``kernels`` do.

Example::

    >>> from opscope.model.records import RawSession
    >>> with_api_calls(RawSession.empty()).device is None
    True
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np

from opscope.model.arrays import distinct
from opscope.model.device import (DEVICE_KINDS, KIND_DRIVER, KIND_RUNTIME, USER_SPAN_DTYPE,
                                  DeviceEvents, api_name, device_event_names)
from opscope.model.events import EventTable, SymbolTable
from opscope.model.function_event import CUDA_CODE, FunctionEvent, FunctionEventAvg
from opscope.model.records import (FLAG_CUDA_DRIVER, FLAG_CUDA_RUNTIME, NO_INPUTS, NO_STACK,
                                   RECORD_DTYPE, SCOPE_USER, RawSession)

# runtime calls torch.profiler (Kineto) leaves out of its traces: frequent, no device work
IGNORED_RUNTIME = frozenset((
    "cudaGetDevice", "cudaSetDevice", "cudaGetLastError", "cudaEventCreate",
    "cudaEventCreateWithFlags", "cudaEventDestroy",
))


def _api_keep(kinds: np.ndarray, names: List[str], correlations: np.ndarray,
              device_correlations: np.ndarray) -> np.ndarray:
    """Which API calls become rows: runtime calls but Kineto's few, driver calls that launched."""
    keep = np.zeros(len(kinds), dtype=bool)
    launched = np.isin(correlations, device_correlations)
    for i, (kind, name) in enumerate(zip(kinds.tolist(), names)):
        if kind == KIND_RUNTIME:
            keep[i] = name not in IGNORED_RUNTIME
        elif kind == KIND_DRIVER:
            keep[i] = bool(launched[i]) or name.startswith("cuLaunch")
    return keep


def _covering(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Per point: True where some [start, end] holds it (intervals in start order)."""
    if len(starts) == 0:
        return np.zeros(len(points), dtype=bool)
    reach = np.maximum.accumulate(ends)
    at = np.searchsorted(starts, points, side="right") - 1
    ok = at >= 0
    out = np.zeros(len(points), dtype=bool)
    out[ok] = reach[at[ok]] >= points[ok]
    return out


def match_threads(raw: RawSession, api: np.ndarray) -> Dict[int, int]:
    """CUPTI thread id -> thread index in ``raw``: the known ones, then by time.

    A CUPTI thread not known from the collector's start is the thread whose ops
    cover the most of its calls (autograd's device threads, DataLoader threads);
    none covering any: -1, a thread of its own.
    """
    index_of_tid = {tid: i for i, tid in enumerate(raw.thread_ids)}
    out: Dict[int, int] = {}
    for key, tid in raw.device_threads.items():
        if tid in index_of_tid:
            out[key] = index_of_tid[tid]
    rec = raw.records
    spans: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
    for t in distinct(rec["thread_index"]).tolist():
        mine = rec[rec["thread_index"] == t]
        order = np.argsort(mine["start_ns"], kind="stable")
        spans[t] = (mine["start_ns"][order], mine["end_ns"][order])
    taken = set(out.values())
    for key in distinct(api["thread"]).tolist():
        if key in out:
            continue
        calls = api[api["thread"] == key]
        mid = (calls["start_ns"] + calls["end_ns"]) // 2
        best, best_hits = -1, 0
        for t, (s, e) in spans.items():
            hits = int(_covering(s, e, mid).sum())
            if hits > best_hits or (hits == best_hits and hits and best in taken):
                best, best_hits = t, hits
        out[key] = best
    return out


def with_api_calls(raw: RawSession) -> RawSession:
    """``raw`` with its CUDA API calls as op records and ``device`` reduced to device work."""
    if raw.device is None:
        return raw
    dev = raw.device
    is_api = np.isin(dev["kind"], (KIND_RUNTIME, KIND_DRIVER))
    work = dev[np.isin(dev["kind"], DEVICE_KINDS)]
    api = dev[is_api]
    names = [api_name(raw.device_names[i]) if 0 <= i < len(raw.device_names) else "?"
             for i in api["name_id"].tolist()]
    keep = _api_keep(api["kind"], names, api["correlation"], work["correlation"])
    api, names = api[keep], [n for n, k in zip(names, keep.tolist()) if k]
    thread_of = match_threads(raw, api)
    thread_ids = list(raw.thread_ids)
    own_thread: Dict[int, int] = {}
    rows = np.zeros(len(api), dtype=RECORD_DTYPE)
    threads, first = np.unique(raw.records["thread_index"], return_index=True)
    rf_of = dict(zip(threads.tolist(), raw.records["rf_thread_id"][first].tolist()))
    index = np.empty(len(api), dtype=np.int32)
    for i, key in enumerate(api["thread"].tolist()):
        t = thread_of.get(key, -1)
        if t < 0:
            if key not in own_thread:
                own_thread[key] = len(thread_ids)
                thread_ids.append(int(key))
            t = own_thread[key]
        index[i] = t
    symbols = SymbolTable(raw.names)
    rows["start_ns"], rows["end_ns"] = api["start_ns"], api["end_ns"]
    rows["seq_nr"] = -1
    rows["name_id"] = [symbols.intern(n) for n in names]
    rows["thread_index"] = index
    rows["rf_thread_id"] = [rf_of.get(int(t), 0) for t in index.tolist()]
    rows["input_offset"] = NO_INPUTS
    rows["flags"] = np.where(api["kind"] == KIND_DRIVER, FLAG_CUDA_DRIVER, FLAG_CUDA_RUNTIME)
    records = np.concatenate([raw.records, rows])
    correlation = np.concatenate([
        raw.correlation if raw.correlation is not None else np.zeros(len(raw.records), np.uint32),
        api["correlation"].astype(np.uint32)])
    stack_ids = raw.stack_ids
    if stack_ids is not None:
        stack_ids = np.concatenate([np.asarray(stack_ids, dtype=np.int64),
                                    np.full(len(rows), NO_STACK, dtype=np.int64)])
    flops = raw.flops
    if flops is not None:
        flops = np.concatenate([np.asarray(flops, dtype=np.int64), np.zeros(len(rows), np.int64)])
    work = work[np.argsort(work["start_ns"], kind="stable")]
    return dataclasses.replace(raw, records=records, names=symbols.names, thread_ids=thread_ids,
                               correlation=correlation, stack_ids=stack_ids, flops=flops,
                               device=work)


def link_device(table: EventTable, raw: RawSession) -> DeviceEvents:
    """Each device event's launching row and owning op (see the module doc)."""
    work = raw.device
    names = device_event_names(work, raw.device_names)
    n = len(work)
    launch = np.full(n, -1, dtype=np.int64)
    row_corr = table_correlations(table)
    if row_corr is not None:
        has = np.flatnonzero(row_corr > 0)
        order = has[np.argsort(row_corr[has], kind="stable")]
        sorted_corr = row_corr[order]
        want = work["correlation"].astype(np.int64)
        at = np.searchsorted(sorted_corr, want)
        ok = (at < len(sorted_corr)) & (want > 0)
        ok[ok] &= sorted_corr[at[ok]] == want[ok]
        launch[ok] = order[at[ok]]
    owner = np.where(launch >= 0, table.parent[np.maximum(launch, 0)], -1)
    module_ids = {i for i, n in enumerate(table.symbols.names) if n in (raw.modules or {})}
    return DeviceEvents(records=work, names=names, launch_row=launch, owner_row=owner,
                        user_spans=user_spans(table, work, owner, module_ids))


def user_spans(table: EventTable, work: np.ndarray, owner: np.ndarray,
               module_ids: frozenset = frozenset()) -> np.ndarray:
    """torch's ``gpu_user_annotation`` spans: the device work under each user range.

    Each device event belongs to the innermost user range (``record_function``)
    open over the op that launched it; per (range, device, stream), the span
    runs from the first such event's start to the last one's end. opscope's
    module ranges (names ``module_ids``, ``with_modules``) are not user ranges
    to torch, so they make no span.
    """
    user_of: Dict[int, int] = {}

    def innermost_user(row: int) -> int:
        path = []
        found = -1
        while row >= 0:
            if row in user_of:
                found = user_of[row]
                break
            path.append(row)
            if table.scope[row] == SCOPE_USER and int(table.name_id[row]) not in module_ids:
                found = row
                break
            row = int(table.parent[row])
        for r in path:
            user_of[r] = found
        return found

    spans: Dict[Tuple[int, int, int], List[int]] = {}
    for o, dev, stream, start, end in zip(owner.tolist(), work["device"].tolist(),
                                          work["stream"].tolist(), work["start_ns"].tolist(),
                                          work["end_ns"].tolist()):
        if o < 0:
            continue
        u = innermost_user(o)
        if u < 0:
            continue
        span = spans.get((u, dev, stream))
        if span is None:
            spans[(u, dev, stream)] = [start, end]
        else:
            span[0], span[1] = min(span[0], start), max(span[1], end)
    out = np.zeros(len(spans), dtype=USER_SPAN_DTYPE)
    for i, ((u, dev, stream), (start, end)) in enumerate(sorted(spans.items(),
                                                                 key=lambda kv: kv[1][0])):
        out[i] = (u, dev, stream, start, end)
    return out


def device_times(table: EventTable, device: DeviceEvents) -> Tuple[np.ndarray, np.ndarray]:
    """Per row: (its own device ns: what it launched, device ns of it and its subtree)."""
    n = len(table)
    own = np.zeros(n, dtype=np.int64)
    has = device.owner_row >= 0
    if has.any():
        own = np.bincount(device.owner_row[has], weights=device.duration_ns[has],
                          minlength=n).astype(np.int64)
    total = own.copy()
    parent = table.parent
    # rows are in tree order (a parent before its children): sum from the leaves up
    for i in np.flatnonzero(parent >= 0)[::-1].tolist():
        total[parent[i]] += total[i]
    return own, total


def table_correlations(table: EventTable) -> Optional[np.ndarray]:
    """Per table row, the CUDA correlation id of an API call row (0: none); None: none."""
    corr = getattr(table.raw, "correlation", None)
    if corr is None or len(table) == 0:
        return None
    rec = table.record
    return np.where(rec >= 0, np.asarray(corr, dtype=np.int64)[np.maximum(rec, 0)], 0)


def session_correlations(session) -> Optional[np.ndarray]:
    """``table_correlations`` of a session's table."""
    return table_correlations(session.table)


def session_device_times(session) -> Tuple[np.ndarray, np.ndarray]:
    """``device_times`` of a session's table, computed once per session."""
    return session.derived("device_times", lambda s: device_times(s.table, s.device))


def _cuda_device_type() -> int:
    return CUDA_CODE


def device_key_averages(device: DeviceEvents, *, group_by_input_shape: bool = False,
                        table_names=None) -> List:
    """One ``key_averages`` row per device event name (kernels, copies, memsets), as torch's.

    A row has no CPU time; its device time is the events' own. With
    ``table_names`` (row -> name), each user range with device work adds a row
    of its ``gpu_user_annotation`` spans.

    >>> from opscope.model.device import DEVICE_DTYPE, KIND_KERNEL
    >>> recs = np.zeros(3, DEVICE_DTYPE); recs["kind"] = KIND_KERNEL
    >>> recs["end_ns"] = [2000, 3000, 500]
    >>> ev = DeviceEvents(recs, ["k1", "k1", "k2"], np.full(3, -1), np.full(3, -1))
    >>> [(r.key, r.count, r.self_cuda_time_total) for r in device_key_averages(ev)]
    [('k1', 2, 5.0), ('k2', 1, 0.5)]
    """
    if len(device) == 0:
        return _user_span_rows(device, table_names, group_by_input_shape)
    keys: Dict[str, int] = {}
    codes = np.fromiter((keys.setdefault(n, len(keys)) for n in device.names), np.int64,
                        len(device.names))
    dur = np.bincount(codes, weights=device.duration_ns, minlength=len(keys)) / 1000.0
    count = np.bincount(codes, minlength=len(keys))
    kind = _cuda_device_type()
    rows = []
    for name, k in keys.items():
        row = FunctionEventAvg(name, count=int(count[k]),
                               input_shapes=[] if group_by_input_shape else "")
        row.set_device_time(float(dur[k]), float(dur[k]), device_type=kind)
        rows.append(row)
    return rows + _user_span_rows(device, table_names, group_by_input_shape)


def _user_span_rows(device: DeviceEvents, table_names, group_by_input_shape: bool) -> List:
    """One row per user range name with device work: its spans' device time (torch's)."""
    spans = device.user_spans
    if len(spans) == 0 or table_names is None:
        return []
    rows: Dict[str, FunctionEventAvg] = {}
    kind = _cuda_device_type()
    for row, start, end in zip(spans["row"].tolist(), spans["start_ns"].tolist(),
                               spans["end_ns"].tolist()):
        name = table_names(row)
        avg = rows.get(name)
        if avg is None:
            avg = rows[name] = FunctionEventAvg(
                name, input_shapes=[] if group_by_input_shape else "", is_user_annotation=True,
                scope=SCOPE_USER)
            avg.set_device_time(0.0, 0.0, device_type=kind)
        avg.count += 1
        us = max(end - start, 0) / 1000.0
        avg.set_device_time(avg.self_device_time_total + us, avg.device_time_total + us)
    return list(rows.values())


def device_function_events(session, first_id: int) -> List:
    """One FunctionEvent per device event (device_type CUDA), ids from ``first_id``."""
    device = session.device
    table = session.table
    rec, spans = device.records, device.user_spans
    out: List[FunctionEvent] = []

    def add(name: str, dev: int, stream: int, start: int, end: int, **user) -> None:
        ev = DeviceFunctionEvent(id=first_id + len(out), name=name, thread=stream,
                                 start_us=(start - table.base_ns) / 1000.0,
                                 end_us=(end - table.base_ns) / 1000.0, **user)
        ev.device_index, ev.device_resource_id = dev, stream
        dur = max(end - start, 0) / 1000.0
        ev.set_device_time(dur, dur, device_type=_cuda_device_type())
        out.append(ev)

    for name, dev, stream, start, end in zip(
            device.names, rec["device"].tolist(), rec["stream"].tolist(),
            rec["start_ns"].tolist(), rec["end_ns"].tolist()):
        add(name, dev, stream, start, end)
    for row, dev, stream, start, end in zip(
            spans["row"].tolist(), spans["device"].tolist(), spans["stream"].tolist(),
            spans["start_ns"].tolist(), spans["end_ns"].tolist()):
        add(table.name(row), dev, stream, start, end, is_user_annotation=True, scope=SCOPE_USER)
    return out


class DeviceFunctionEvent(FunctionEvent):
    """A kernel, copy or memset as an event: device time only, no CPU time (as torch's)."""

    @property
    def cpu_time_total(self) -> float:
        return 0.0

    @property
    def self_cpu_time_total(self) -> float:
        return 0.0
