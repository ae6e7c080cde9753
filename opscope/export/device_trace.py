"""The device side of the Chrome trace, in torch.profiler 2.13's schema.

A device collector's session adds to the trace: one process per device
(``pid`` the device index, labelled ``GPU N``) with one thread per stream;
``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events there, and a
``gpu_user_annotation`` span per user range and stream that ran its work; ``cuda_runtime``
and ``cuda_driver`` events on the host threads (written as op rows, see
``row_categories``); and an ``ac2g`` flow from each launching call to the
device work it launched. Both ends carry the CUDA ``correlation`` id in
``args``, as Kineto writes them, so HTA, Perfetto and chrome://tracing link them.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> lines = []
    >>> write_device_events(build_session(RawSession.empty()), 1, 0, lines.append)
    >>> lines
    []
"""

from __future__ import annotations

import json
from typing import Callable, List, Optional

import numpy as np

from opscope.model.arrays import distinct
from opscope.export.units import micros_text as _us
from opscope.model.device import CATEGORIES, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET
from opscope.model.records import FLAG_CUDA_DRIVER, FLAG_CUDA_RUNTIME, SCOPE_USER

Line = Callable[[str], None]


def row_categories(table, rows: Optional[np.ndarray] = None) -> List[str]:
    """The ``cat`` of each op row (of ``rows``; None: all): user_annotation, cpu_op,
    cuda_runtime or cuda_driver."""
    scope, flags = (table.scope, table.flags) if rows is None else (table.scope[rows],
                                                                    table.flags[rows])
    cats = np.where(scope == SCOPE_USER, "user_annotation", "cpu_op").astype(object)
    cats[(flags & FLAG_CUDA_RUNTIME) != 0] = "cuda_runtime"
    cats[(flags & FLAG_CUDA_DRIVER) != 0] = "cuda_driver"
    return cats.tolist()


def write_device_processes(session, start_us: str, line: Line) -> None:
    """The ``M`` events naming each device's process and each stream's thread."""
    device = getattr(session, "device", None)
    if device is None or len(device) == 0:
        return
    rec = device.records
    meta = '{"ph": "M", "name": "%s", "ts": %s, "pid": %d, "tid": %d, "args": {"%s": %s}}'
    for dev in distinct(rec["device"]).tolist():
        line(meta % ("process_name", start_us, dev, 0, "name", '"python"'))
        line(meta % ("process_labels", start_us, dev, 0, "labels", json.dumps(f"GPU {dev}")))
        line(meta % ("process_sort_index", start_us, dev, 0, "sort_index", 5000000 + dev))
        mine = rec[rec["device"] == dev]
        for stream in distinct(mine["stream"]).tolist():
            line(meta % ("thread_name", start_us, dev, stream, "name",
                         json.dumps(f"stream {stream}")))
            line(meta % ("thread_sort_index", start_us, dev, stream, "sort_index", stream))


def _args(kind: int, r, owner: int, dur_ns: int) -> str:
    """The ``args`` object of one device event, with torch's keys."""
    base = (f'"External id": {owner + 1}, ' if owner >= 0 else "")  # none: torch writes none
    base += (f'"device": {int(r["device"])}, '
            f'"context": {int(r["context"])}, "stream": {int(r["stream"])}, '
            f'"correlation": {int(r["correlation"])}')
    if kind == KIND_KERNEL:
        grid = ", ".join(str(int(v)) for v in r["grid"])
        block = ", ".join(str(int(v)) for v in r["block"])
        shared = int(r["shared_static"]) + int(r["shared_dynamic"])
        extra = (f', "registers per thread": {int(r["registers"])}, "shared memory": {shared}, '
                 f'"grid": [{grid}], "block": [{block}]')
        if r["graph_node"]:
            extra += f', "graph node id": {int(r["graph_node"])}'
        return base + extra
    nbytes = int(r["bytes"])
    rate = nbytes / dur_ns if dur_ns > 0 else 0.0  # bytes/ns = GB/s
    return base + f', "bytes": {nbytes}, "memory bandwidth (GB/s)": {rate:.6g}'


def write_device_events(session, pid: int, shift: int, line: Line) -> None:
    """One ``X`` event per kernel, copy and memset, and an ``ac2g`` s/f pair per launch."""
    device = getattr(session, "device", None)
    if device is None or len(device) == 0:
        return
    table = session.table
    tids = table.os_tid
    rec = device.records
    dur = device.duration_ns
    names = {}
    for i, (r, owner, launch) in enumerate(zip(rec, device.owner_row.tolist(),
                                               device.launch_row.tolist())):
        kind = int(r["kind"])
        if kind not in (KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET):
            continue
        name = device.names[i]
        quoted = names.get(name)
        if quoted is None:
            quoted = names[name] = json.dumps(name)
        ts = _us(int(r["start_ns"]) + shift)
        dev, stream = int(r["device"]), int(r["stream"])
        line('{"ph": "X", "cat": "%s", "name": %s, "pid": %d, "tid": %d, "ts": %s, "dur": %s, '
             '"args": {%s}}' % (CATEGORIES[kind], quoted, dev, stream, ts, _us(int(dur[i])),
                                _args(kind, r, owner, int(dur[i]))))
        if launch >= 0:
            corr = int(r["correlation"])
            line('{"ph": "s", "id": %d, "pid": %d, "tid": %d, "ts": %s, "cat": "ac2g", '
                 '"name": "ac2g"}' % (corr, pid, int(tids[launch]),
                                      _us(int(table.start_ns[launch]) + shift)))
            line('{"ph": "f", "id": %d, "pid": %d, "tid": %d, "ts": %s, "cat": "ac2g", '
                 '"name": "ac2g", "bp": "e"}' % (corr, dev, stream, ts))
    spans = device.user_spans
    for row, dev, stream, start, end in zip(spans["row"].tolist(), spans["device"].tolist(),
                                            spans["stream"].tolist(), spans["start_ns"].tolist(),
                                            spans["end_ns"].tolist()):
        line('{"ph": "X", "cat": "gpu_user_annotation", "name": %s, "pid": %d, "tid": %d, '
             '"ts": %s, "dur": %s, "args": {"External id": %d}}'
             % (json.dumps(table.name(row)), dev, stream, _us(start + shift),
                _us(max(end - start, 0)), row + 1))
