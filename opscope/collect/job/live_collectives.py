"""This rank's collectives as they stand now, read live from torch's flight recorder.

The hang detector (:mod:`opscope.on_demand.hang`) needs, while the job runs,
which collective each rank is inside: its process group, its number there
(``collective_seq_id``, torch's own, the same on every rank of the group) and
its op. torch's flight recorder keeps exactly that for every backend, gloo
included, once ``TORCH_FR_BUFFER_SIZE`` is set before the process group is
created (:func:`enable_flight_recorder`; ``opscope run`` sets it when the user
has not). It costs the job what torch's recorder costs per collective and
nothing of opscope's: no hook of ours runs per collective.

Two reads, from a background thread:

- :func:`pending_groups`, each poll: per process group, the last collective
  enqueued and the last completed (the recorder's ``pg_status``, without its
  entries: about 10 us). A group whose pair stays unequal is inside a collective.
- :func:`rank_state`, only when the job asks (a suspected hang): the recorder's
  entries (tens of ms for a full buffer) give each group's last entered number
  and the collectives not yet retired; torch.distributed's own tables give the
  groups' ranks; ``sys._current_frames()`` gives the main thread's Python stack.

Example::

    >>> environ = {}
    >>> enable_flight_recorder(environ), environ
    (True, {'TORCH_FR_BUFFER_SIZE': '2000'})
    >>> enable_flight_recorder({"TORCH_FR_BUFFER_SIZE": "0"})   # the user turned it off
    False
    >>> pending_groups() is None   # no process group in this process
    True
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from typing import Any, Dict, List, MutableMapping, Optional, Tuple

from opscope.collect.job.flight_recorder import BUFFER_ENV, c10d_bindings

DEFAULT_BUFFER = "2000"  # entries: torch's own default where it turns the recorder on
MAX_STACK_FRAMES = 40  # the innermost frames of the main thread kept in a state
MAX_ACTIVE = 16  # collectives not retired kept in a state (DDP has a few in flight)


def enable_flight_recorder(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """Turn torch's flight recorder on unless the user set its size; True when it is on.

    Call it before the job creates its process group (torch reads the
    variable then).
    """
    environ = os.environ if environ is None else environ
    environ.setdefault(BUFFER_ENV, DEFAULT_BUFFER)
    try:
        return int(environ[BUFFER_ENV]) > 0
    except ValueError:
        return False


def _c10d() -> Any:
    """torch's c10d bindings, where a process group exists and the recorder can be read."""
    c10d = c10d_bindings()
    return c10d if hasattr(c10d, "_dump_fr_trace_json") else None


def recorder_readable() -> bool:
    """True where this torch's flight recorder can be read (a process group exists)."""
    return _c10d() is not None


def pending_groups() -> Optional[Dict[str, Tuple[int, int]]]:
    """Per recorder group id: (last collective enqueued, last completed); None without one.

    The ids are this process's own; a pair stays unequal while a collective
    of that group has not completed. Never raises.
    """
    c10d = _c10d()
    if c10d is None:
        return None
    try:
        doc = json.loads(c10d._dump_fr_trace_json(includeCollectives=False))
        return {str(pg): (int(s["last_enqueued_collective"]), int(s["last_completed_collective"]))
                for pg, s in doc["pg_status"].items()}
    except Exception:  # noqa: BLE001  (an unreadable recorder: nothing pending)
        return None


def _entries(c10d: Any) -> List[Dict[str, Any]]:
    doc = json.loads(c10d._dump_fr_trace_json(includeCollectives=True))
    return [e for e in doc.get("entries") or [] if isinstance(e, dict)]


def _collective(entry: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """One recorder entry as the detector names it, or None (a point-to-point op, junk)."""
    try:
        if entry.get("is_p2p") or int(entry["collective_seq_id"]) <= 0:
            return None
        return {"group": str(entry["process_group"][0]),
                "seq": int(entry["collective_seq_id"]),
                "op": str(entry["profiling_name"]),
                "entered_ns": int(entry["time_created_ns"]),
                "input_sizes": entry.get("input_sizes"),
                "input_dtypes": entry.get("input_dtypes")}
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def _groups() -> Dict[str, Dict[str, Any]]:
    """The process groups this rank is in: name -> {"desc", "ranks"} (global ranks)."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    groups = {}
    for pg, name in list(world.pg_names.items()):
        ranks = sorted(int(r) for r in (world.pg_group_ranks.get(pg) or {}))
        groups[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""), "ranks": ranks}
    return groups


def _library_folders() -> Tuple[str, ...]:
    """Where torch, opscope and the standard library live: frames there are not the user's."""
    folders = [sysconfig.get_paths()["stdlib"], os.path.dirname(os.path.dirname(__file__))]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        folders.append(os.path.dirname(torch.__file__))
    return tuple(os.path.join(os.path.realpath(f), "") for f in folders)


def main_thread_stack(limit: int = MAX_STACK_FRAMES) -> List[Dict[str, Any]]:
    """The main thread's Python stack now, outermost first: {"file", "line", "function", "lib"}.

    ``lib`` is true for a frame of torch, opscope or the standard library.

    >>> frame = main_thread_stack()[-1]   # called from the main thread: this very frame
    >>> frame["function"], frame["lib"]
    ('main_thread_stack', True)
    """
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return []
    folders = _library_folders()
    return [{"file": f.filename, "line": f.lineno, "function": f.name,
             "lib": f.filename.startswith("<") or os.path.realpath(f.filename).startswith(folders)}
            for f in traceback.extract_stack(frame, limit=limit)]


def rank_state(rank: int) -> Optional[Dict[str, Any]]:
    """This rank's state for the hang detector; None without a readable recorder.

    ``entered``: per group, the last collective number this rank entered (as
    far as the recorder's buffer reaches); ``active``: the collectives
    entered and not retired, oldest first; ``stack``: the main thread's.
    """
    c10d = _c10d()
    if c10d is None:
        return None
    entered: Dict[str, int] = {}
    active = []
    for entry in _entries(c10d):
        found = _collective(entry)
        if found is None:
            continue
        entered[found["group"]] = max(entered.get(found["group"], 0), found["seq"])
        if not entry.get("retired", True):
            active.append(found)
    try:
        groups = _groups()
    except Exception:  # noqa: BLE001  (a torch without these tables: groups from entries only)
        groups = {}
    return {"rank": rank, "time_ns": time.time_ns(), "groups": groups, "entered": entered,
            "active": active[:MAX_ACTIVE], "stack": main_thread_stack()}
