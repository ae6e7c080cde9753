"""torch's flight recorder, read at a recording's stop: each collective's group and number.

With ``TORCH_FR_BUFFER_SIZE`` set, torch.distributed keeps the last collectives
of every process group, each with its group and ``collective_seq_id``: the
key that matches a collective across ranks, subgroups included
(``opscope.analysis.flight_recorder``). opscope keeps the entries created
during the window, as compact rows in the trace metadata (``FLIGHT_RECORDER_KEY``):
``[group name, collective_seq_id, profiling name, time created (Unix ns)]``.

>>> flight_recorder_rows(0) is None   # no recorder buffer in this process
True
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, List, Optional

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
MAX_ROWS = 200_000  # a buffer is bounded by the env var; this bounds what a trace holds


def _enabled() -> bool:
    try:
        return int(os.environ.get(BUFFER_ENV, "0") or 0) > 0
    except ValueError:
        return False


def _dump() -> Optional[dict]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import torch

    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    doc = json.loads(dump())
    return doc if isinstance(doc, dict) else None


def flight_recorder_rows(since_unix_ns: int) -> Optional[List[List[Any]]]:
    """The collectives the recorder saw from ``since_unix_ns`` on, or None without one.

    Never raises: a recorder that cannot be read gives None.
    """
    if not _enabled():
        return None
    try:
        doc = _dump()
    except Exception:  # noqa: BLE001  (never harm the job: the ordinal rule applies)
        return None
    if doc is None:
        return None
    rows = []
    for entry in doc.get("entries") or []:
        try:
            created = int(entry["time_created_ns"])
            group = entry["process_group"][0]
            seq = int(entry["collective_seq_id"])
            name = str(entry["profiling_name"])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        if created >= since_unix_ns and seq > 0:
            rows.append([str(group), seq, name, created])
    return rows[-MAX_ROWS:]
