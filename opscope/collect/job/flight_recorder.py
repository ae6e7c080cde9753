"""torch's flight recorder, read at a recording's stop: each collective's group, number, sizes.

torch.distributed keeps the last collectives of the process (``TORCH_FR_BUFFER_SIZE``
of them: 2000 by default in torch 2.13, none in torches whose default is 0), each
with its group and ``collective_seq_id`` (the key that matches a collective
across ranks, subgroups included), its tensors' sizes and dtypes and the
Python stack that issued it. It costs the job nothing more: torch records them
whether or not opscope reads them. opscope reads them at stop (unless
``TORCH_FR_BUFFER_SIZE`` is 0) and keeps the entries created during the window,
as compact rows in the trace metadata (``FLIGHT_RECORDER_KEY``): ``[group name,
sequence number, profiling name, time created (Unix ns), group description, input
elements, output elements, dtype, call site, is point-to-point]``
(``opscope.analysis.flight_recorder`` gives them to the collectives' events).

A window of more collectives than the buffer holds would lose its first ones'
facts, so ``FlightDrain`` reads the buffer at a ``prof.step()`` once half of it
has been filled since the last read (torch's per-group counters tell, for about
30 us a step), and keeps every row of the window.

>>> flight_recorder_rows(0) is None   # no recorder buffer in this process
True
>>> drain = FlightDrain(0); drain.on_step(); drain.rows()   # nor here
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any, List, Optional, Sequence

import numpy as np

from opscope.model.collective_facts import user_call_site
from opscope.model.torch_names import C10D_PREFIX

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
DEFAULT_BUFFER = 2000  # entries, where the variable is unset (torch 2.13's default)
MAX_ROWS = 200_000  # a buffer is bounded by the env var; this bounds what a trace holds


def _enabled() -> bool:
    """False where the user turned the recorder off (``TORCH_FR_BUFFER_SIZE=0``)."""
    try:
        return int(os.environ.get(BUFFER_ENV, "1") or 1) > 0
    except ValueError:
        return False


def c10d_bindings() -> Any:
    """torch's c10d bindings where this process has a process group, else None (never
    imports torch.distributed; never raises, a group torn down meanwhile included)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
    except Exception:  # noqa: BLE001  (torn down meanwhile)
        return None
    return sys.modules["torch"]._C._distributed_c10d


def _dump() -> Optional[dict]:
    c10d = c10d_bindings()
    if c10d is None:
        return None
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is not None:  # torch's pickle, made here by torch, faster than its JSON; the
        # stacks only where torch._inductor is imported: torch's symbolizer imports it
        # (10-20 s here), after which 2000 stacks take 0.05 s
        stacks = "torch._inductor" in sys.modules
        try:
            doc = pickle.loads(dump(includeCollectives=True, includeStackTraces=stacks,
                                    onlyActive=False))
        except TypeError:  # a torch without these arguments
            doc = None
        if isinstance(doc, dict):
            return doc
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    doc = json.loads(dump())
    return doc if isinstance(doc, dict) else None


def _nelems(sizes: Any) -> int:
    """Elements of a list of tensor shapes (``[[2, 4], [3]]`` -> 11)."""
    total = 0
    for shape in sizes:
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count
    return total


def _call_site(frames: Any) -> Optional[str]:
    """The innermost frame of the user's code among the recorder's frames (innermost first)."""
    texts = []
    for frame in frames if isinstance(frames, list) else ():
        try:
            texts.append(f"{frame['filename']}({int(frame['line'])}): {frame['name']}")
        except (KeyError, TypeError, ValueError):
            continue
    return user_call_site(texts)


def flight_row(entry: dict) -> List[Any]:
    """One recorder entry as a metadata row (see the module docstring); raises on a bad one.

    >>> flight_row({"time_created_ns": 5, "process_group": ["1", "sub"], "is_p2p": False,
    ...             "collective_seq_id": 3, "profiling_name": "gloo:all_gather",
    ...             "input_sizes": [[4]], "output_sizes": [[2, 4]], "input_dtypes": ["Float"]})
    ['1', 3, 'gloo:all_gather', 5, 'sub', 4, 8, 'Float', None, False]
    """
    p2p = bool(entry.get("is_p2p", False))
    dtypes = list(entry.get("input_dtypes") or []) + list(entry.get("output_dtypes") or [])
    return [str(entry["process_group"][0]),
            int(entry["p2p_seq_id" if p2p else "collective_seq_id"]),
            str(entry["profiling_name"]), int(entry["time_created_ns"]),
            str(entry["process_group"][1]), _nelems(entry.get("input_sizes") or []),
            _nelems(entry.get("output_sizes") or []), str(dtypes[0]) if dtypes else None,
            _call_site(entry.get("frames")), p2p]


def issued_collectives(names: Sequence[str], name_ids: np.ndarray) -> bool:
    """Whether records with these name ids hold a dispatcher collective (``c10d::``).

    >>> issued_collectives(["aten::add", "c10d::allreduce_"], np.array([0, 0]))
    False
    """
    ids = [i for i, name in enumerate(names) if name.startswith(C10D_PREFIX)]
    return bool(ids) and bool(np.isin(name_ids, ids).any())


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
            if int(entry["time_created_ns"]) < since_unix_ns:
                continue
            row = flight_row(entry)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            continue
        if row[1] > 0:
            rows.append(row)
    return rows[-MAX_ROWS:] or None


def enqueued_so_far() -> Optional[int]:
    """Collectives enqueued so far in this process, all groups (the recorder's counters);
    None without a readable recorder. Never raises."""
    c10d = c10d_bindings()
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None or not _enabled():
        return None
    try:
        status = json.loads(dump(includeCollectives=False))["pg_status"]
        return sum(int(s["last_enqueued_collective"]) for s in status.values())
    except Exception:  # noqa: BLE001  (an unreadable recorder: no count)
        return None


def _buffer_size() -> int:
    try:
        return int(os.environ.get(BUFFER_ENV) or DEFAULT_BUFFER)
    except ValueError:
        return DEFAULT_BUFFER


class FlightDrain:
    """The recorder's rows of one window, read at steps before its buffer wraps (module
    docstring); ``rows()`` at stop gives them all, oldest first, or None."""

    def __init__(self, since_unix_ns: int) -> None:
        self._since = since_unix_ns
        self._kept: dict = {}
        self._read_at = enqueued_so_far()

    def _keep(self, rows: Optional[List[List[Any]]]) -> None:
        for row in rows or ():
            self._kept[(row[0], row[1], row[9], row[2])] = row
        if len(self._kept) > MAX_ROWS:  # the newest MAX_ROWS
            newest = sorted(self._kept.items(), key=lambda kv: kv[1][3])[-MAX_ROWS:]
            self._kept = dict(newest)

    def on_step(self) -> None:
        """Read the buffer if half of it filled since the last read. Never raises."""
        now = enqueued_so_far()
        if now is None:
            return
        if self._read_at is None:
            self._read_at = now
        elif now - self._read_at >= max(1, _buffer_size() // 2):
            self._keep(flight_recorder_rows(self._since))
            self._read_at = now

    def rows(self) -> Optional[List[List[Any]]]:
        """Every row of the window (a last read now), oldest first; None without any."""
        self._keep(flight_recorder_rows(self._since))
        rows = sorted(self._kept.values(), key=lambda row: row[3])
        return rows or None
