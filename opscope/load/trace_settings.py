"""What a saved trace holds beside its op events: settings, memory, marks and modules.

``trace_events`` turns the op events into records; this module reads the
rest into the fields a collector fills in a ``RawSession``:

- the top-level keys: the options (``record_shapes``...) and the metadata
  (every other key, as JSON text);
- ``[memory]`` instants: the allocator records (``records.MEMORY_DTYPE``);
- other CPU instants: the marks of ``opscope.itt.mark``;
- the args of the ranges that mark an ``nn.Module`` call: its ModuleInfo.

>>> trace_settings({"record_shapes": 1, "trace_id": "X", "note": [1]})
({'record_shapes': True, 'profile_memory': False, 'with_stack': False, 'with_flops': False, \
'with_modules': False}, {'record_shapes': '1', 'note': '[1]'})
"""

from __future__ import annotations

import json
from operator import methodcaller
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from opscope.load.trace_scan import float_column, hashable, int_column, to_ns
from opscope.model.modules import ModuleInfo, module_info_from_trace_args
from opscope.model.records import MEMORY_DTYPE
from opscope.model.session import OPTION_NAMES

# Top-level keys that describe the file, not the session (never kept as metadata).
FORMAT_KEYS = frozenset({
    "schemaVersion", "deviceProperties", "trace_id", "displayTimeUnit",
    "baseTimeNanoseconds", "traceEvents", "traceName",
})


def trace_settings(doc: Dict[str, Any]) -> Tuple[Dict[str, bool], Dict[str, str]]:
    """Options (the flag keys) and metadata (other top-level keys, as JSON text)."""
    options = {name: bool(doc.get(name)) for name in OPTION_NAMES}
    metadata: Dict[str, str] = {}
    for key, value in doc.items():
        if key in FORMAT_KEYS or not isinstance(key, str):
            continue
        if key in OPTION_NAMES:
            if options[key]:
                metadata[key] = "1"  # as opscope.profile records it
            continue
        try:
            metadata[key] = json.dumps(value, allow_nan=False)
        except ValueError:
            continue
    return options, metadata


_MEMORY_ARGS = (("addr", "Addr"), ("bytes", "Bytes"), ("total_allocated", "Total Allocated"),
                ("total_reserved", "Total Reserved"), ("device_type", "Device Type"),
                ("device_index", "Device Id"))


def memory_records(events: List[dict], origin_us: int, path: str,
                   tids: List[Any], trace_events: List[Any]) -> np.ndarray:
    """``[memory]`` instants as allocator records (``MEMORY_DTYPE``), in trace order.

    A thread seen only in memory events is appended to ``tids``.
    """
    out = np.zeros(len(events), dtype=MEMORY_DTYPE)
    if not events:
        return out
    out["time_ns"] = to_ns(float_column([e.get("ts") for e in events], "ts", path, events,
                                        trace_events), origin_us)
    index = {t: i for i, t in enumerate(tids)}
    keys = [hashable(e.get("tid")) for e in events]
    for key in keys:
        if key not in index:
            index[key] = len(tids)
            tids.append(key)
    out["thread_index"] = [index[key] for key in keys]
    args = [e.get("args") if type(e.get("args")) is dict else {} for e in events]
    for column, key in _MEMORY_ARGS:
        default = -1 if column == "device_index" else 0
        values = int_column(list(map(methodcaller("get", key, default), args)), default)
        if column.startswith("device"):
            values = np.clip(values, -128, 127)
        out[column] = values
    return out


def trace_marks(events: List[dict], origin_us: int, path: str,
                trace_events: List[Any]) -> List[Tuple[int, int, str]]:
    """(ns, OS thread id, message) of each CPU instant event (``opscope.itt.mark``)."""
    if not events:
        return []
    ts = to_ns(float_column([e.get("ts") for e in events], "ts", path, events, trace_events),
               origin_us).tolist()
    return [(t, e.get("tid") if type(e.get("tid")) is int and abs(e.get("tid")) < 2 ** 63
             else 0, str(e.get("name"))) for t, e in zip(ts, events)]


def trace_modules(ops: List[dict], args: List[dict], user_rows: np.ndarray,
                  with_modules: bool) -> Optional[Dict[str, ModuleInfo]]:
    """ModuleInfo by range name, of the ranges whose args have ``Module Class``.

    None when the trace recorded no modules ({} when it was recorded
    ``with_modules`` but none ran).
    """
    found: Dict[str, Dict[str, Any]] = {}
    for i in user_rows.tolist():
        if "Module Class" in args[i]:
            found.setdefault(str(ops[i].get("name")), args[i])
    if not found:
        return {} if with_modules else None
    out = {}
    for name, module_args in found.items():
        info = module_info_from_trace_args(name, module_args)
        if info is not None:
            out[name] = info
    return out
