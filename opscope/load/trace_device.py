"""The device side of a saved trace: kernels, copies and memsets back into records.

torch.profiler's GPU traces and opscope's write ``kernel``, ``gpu_memcpy`` and
``gpu_memset`` events on a device's process (``pid`` the device, ``tid`` the
stream) with the CUDA ``correlation`` id in ``args``, and the launching
``cuda_runtime``/``cuda_driver`` calls among the host ops with the same id.
``device_records`` turns the device events into ``model.device.DEVICE_DTYPE``
records on the loader's clock, so ``build_session`` links them to the ops
exactly as it links a live window's. ``gpu_user_annotation`` spans are not
read: they are derived again from the user ranges.

Example::

    >>> recs, names = device_records([{"ph": "X", "cat": "kernel", "name": "k", "pid": 0,
    ...     "tid": 7, "ts": 2.5, "dur": 1.0, "args": {"correlation": 9}}], 0)
    >>> recs["start_ns"].tolist(), recs["end_ns"].tolist(), recs["correlation"].tolist(), names
    ([2500], [3500], [9], ['k'])
"""

from __future__ import annotations

import math
from itertools import compress, repeat
from typing import Any, Dict, List, Tuple

import numpy as np

from opscope.model.device import DEVICE_DTYPE, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET

DEVICE_CATEGORIES = {"kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY,
                     "gpu_memset": KIND_MEMSET}
_MAX_US = 4e15


def _int(value: Any, default: int = 0, low: int = -2 ** 31, high: int = 2 ** 32 - 1) -> int:
    """An int field of a trace, or ``default`` where it is missing, not an int or out of range."""
    if type(value) is int and low <= value <= high:
        return value
    return default


def _xyz(value: Any) -> Tuple[int, int, int]:
    if isinstance(value, list) and len(value) == 3:
        return tuple(_int(v) for v in value)  # type: ignore[return-value]
    return (0, 0, 0)


def device_records(events: List[dict], origin_us: int) -> Tuple[np.ndarray, List[str]]:
    """DEVICE_DTYPE records (start order) and the name table of a trace's device events.

    Times become integer ns exactly as the ops' do (``origin_us`` keeps the
    product small; see ``trace_scan.to_ns``); an event whose ``ts`` or
    ``dur`` is not a usable number is skipped, as are its other bad fields.
    """
    names: Dict[str, int] = {}
    rows = []
    for e in events:
        ts, dur = e.get("ts"), e.get("dur", 0)
        if type(ts) not in (int, float) or type(dur) not in (int, float):
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)) or abs(ts) > _MAX_US or \
                not 0 <= dur <= _MAX_US:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        name = e.get("name") if isinstance(e.get("name"), str) else "<unnamed>"
        start = int(round((ts - origin_us) * 1000)) + origin_us * 1000  # as load's to_ns
        kind = DEVICE_CATEGORIES[e.get("cat")]
        shared = _int(args.get("shared memory"), 0, 0, 2 ** 31 - 1)
        rows.append((start, start + int(round(dur * 1000)), _int(args.get("bytes"), 0, 0, 2 ** 62),
                     0, _int(args.get("correlation"), 0, 0), 0, _int(e.get("tid"), 0, 0),
                     _int(args.get("context"), 0, 0), names.setdefault(name, len(names)),
                     _int(e.get("pid"), 0), _xyz(args.get("grid")), _xyz(args.get("block")),
                     shared, 0, 0, _int(args.get("registers per thread"), 0, 0, 65535), kind,
                     0, 0, 0, (0,) * 6))
    out = np.array(rows, dtype=DEVICE_DTYPE) if rows else np.zeros(0, DEVICE_DTYPE)
    out = out[np.argsort(out["start_ns"], kind="stable")]
    return out, list(names)


def correlation_column(args: List[Any]) -> np.ndarray:
    """Per op, the CUDA ``correlation`` id in its args (0: none), for runtime and driver calls.

    >>> correlation_column([{"correlation": 5}, {}, {"correlation": "x"}]).tolist()
    [5, 0, 0]
    >>> correlation_column([{"correlation": 7}, None, {"correlation": 2 ** 40}]).tolist()
    [7, 0, 0]
    """
    try:  # the ops that have one, found at C speed (a CPU trace's ops have none)
        rows = list(compress(range(len(args)),
                             map(dict.__contains__, args, repeat("correlation"))))
    except TypeError:  # an op whose args are not an object
        rows = [i for i, a in enumerate(args) if isinstance(a, dict) and "correlation" in a]
    out = np.zeros(len(args), dtype=np.int64)
    for i in rows:
        out[i] = _int(args[i]["correlation"], 0, 0)
    return out
