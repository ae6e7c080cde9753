"""A hang named from the ranks' live states: the collective some ranks entered and others not.

Each rank's state (``opscope.collect.job.live_collectives.rank_state``, read
through the job's c10d store by ``opscope.on_demand.hang``) says, per process
group, the last collective number it entered, the collectives it is inside
(entered, not retired: group, number, op, Unix ns entered) and its main
thread's Python stack. :func:`find_hang` takes the oldest collective some rank
is inside for at least ``hang_after_s`` and that some rank of its group has
not entered: those are the ranks missing, each with the collective it is in
now (None: not in one) and its stack. A rank of the group that entered the
same number with another op is missing too (a desync). A rank that did not
answer (dead, or its Python stuck) is missing with ``"answered": false``.
Ranks all inside the same collective (a slow network, a hang inside the
transport) are no hang here.

States come from a store that anyone reaching the job's port can write:
:func:`parse_state` keeps one only when it has the fields and types below,
within bounds; anything else is skipped, never raised.

Example::

    >>> a = {"rank": 0, "groups": {"0": {"desc": "default_pg", "ranks": [0, 1]}},
    ...      "entered": {"0": 5}, "stack": [],
    ...      "active": [{"group": "0", "seq": 5, "op": "gloo:all_reduce", "entered_ns": 0}]}
    >>> b = {"rank": 1, "groups": a["groups"], "entered": {"0": 4}, "active": [], "stack": []}
    >>> hang = find_hang({0: a, 1: b}, world_size=2, hang_after_s=3, now_ns=4 * 10**9)
    >>> hang["seq"], hang["op"], [m["rank"] for m in hang["missing"]], hang["seconds"]
    (5, 'gloo:all_reduce', [1], 4.0)
    >>> find_hang({0: a, 1: b}, world_size=2, hang_after_s=5, now_ns=4 * 10**9) is None
    True
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

MAX_STATE_BYTES = 256 * 1024
MAX_GROUPS = 4096
MAX_ACTIVE = 64
MAX_FRAMES = 200
MAX_TEXT = 1024
LINE_RANKS = 8  # ranks named in the stderr line; hang.json names them all


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _count(value: Any, top: int = 2 ** 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < top


def _valid_collective(c: Any) -> bool:
    return (isinstance(c, dict) and _text(c.get("group")) and _count(c.get("seq"))
            and _text(c.get("op")) and _count(c.get("entered_ns")))


def _valid_groups(groups: Any, world_size: int) -> bool:
    return isinstance(groups, dict) and len(groups) <= MAX_GROUPS and all(
        _text(name) and isinstance(g, dict) and _text(g.get("desc", ""))
        and isinstance(g.get("ranks"), list) and len(g["ranks"]) <= world_size
        and all(_count(r, world_size) for r in g["ranks"]) for name, g in groups.items())


def _valid_stack(stack: Any) -> bool:
    return isinstance(stack, list) and len(stack) <= MAX_FRAMES and all(
        isinstance(f, dict) and _text(f.get("file")) and _count(f.get("line"))
        and _text(f.get("function")) and isinstance(f.get("lib", False), bool) for f in stack)


def parse_state(text: Optional[str], rank: int, world_size: int) -> Optional[Dict[str, Any]]:
    """Rank ``rank``'s state from the store's text, or None when it is not one (skipped).

    >>> parse_state('{"rank": 1}', 1, 2) is None
    True
    """
    if text is None or len(text) > MAX_STATE_BYTES:
        return None
    try:
        state = json.loads(text)
    except ValueError:
        return None
    if not isinstance(state, dict) or state.get("rank") != rank:
        return None
    entered, active = state.get("entered"), state.get("active")
    if not (_valid_groups(state.get("groups"), world_size) and isinstance(entered, dict)
            and len(entered) <= MAX_GROUPS
            and all(_text(g) and _count(n) for g, n in entered.items())
            and isinstance(active, list) and len(active) <= MAX_ACTIVE
            and all(_valid_collective(c) for c in active) and _valid_stack(state.get("stack"))):
        return None
    return state


def _members(states: Dict[int, Dict[str, Any]], group: str) -> List[int]:
    """The global ranks of ``group``, as the ranks that are in it say."""
    ranks = set()
    for state in states.values():
        ranks.update(state["groups"].get(group, {}).get("ranks", []))
    return sorted(ranks)


def _where(state: Dict[str, Any], group: str, seq: int, op: str) -> str:
    """``inside``, ``done`` (entered and finished), ``other`` (another op there) or ``before``."""
    for c in state["active"]:
        if c["group"] == group and c["seq"] == seq:
            return "inside" if c["op"] == op else "other"
    return "done" if state["entered"].get(group, 0) >= seq else "before"


def _now_in(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    active = state["active"]
    if not active:
        return None
    c = active[0]
    return {"group": c["group"], "seq": c["seq"], "op": c["op"]}


def _candidate(states: Dict[int, Dict[str, Any]], world_size: int, collective: Dict[str, Any],
               now_ns: int) -> Optional[Dict[str, Any]]:
    group, seq, op = collective["group"], collective["seq"], collective["op"]
    members = _members(states, group) or list(range(world_size))
    inside, missing, first_ns = [], [], None
    for rank in members:
        state = states.get(rank)
        where = "silent" if state is None else _where(state, group, seq, op)
        if where == "inside":
            entered_ns = next(c["entered_ns"] for c in state["active"]
                              if (c["group"], c["seq"]) == (group, seq))
            first_ns = entered_ns if first_ns is None else min(first_ns, entered_ns)
            inside.append({"rank": rank, "seconds": round((now_ns - entered_ns) / 1e9, 3),
                           "stack": state["stack"]})
        elif where == "silent":
            missing.append({"rank": rank, "answered": False, "now_in": None, "stack": []})
        elif where != "done":
            missing.append({"rank": rank, "answered": True, "now_in": _now_in(state),
                            "stack": state["stack"]})
    if not missing or first_ns is None:
        return None
    desc = next((s["groups"][group].get("desc", "") for s in states.values()
                 if group in s["groups"]), "")
    return {"group": group, "group_desc": desc, "group_ranks": members, "seq": seq, "op": op,
            "input_sizes": collective.get("input_sizes"),
            "input_dtypes": collective.get("input_dtypes"),
            "seconds": round((now_ns - first_ns) / 1e9, 3), "inside": inside,
            "missing": missing}


def find_hang(states: Dict[int, Dict[str, Any]], *, world_size: int, hang_after_s: float,
              now_ns: int) -> Optional[Dict[str, Any]]:
    """The oldest collective entered ``hang_after_s`` ago or more that a rank is missing from.

    ``states`` maps each rank that answered to its parsed state. The result
    (None: no hang) is what ``hang.json`` holds, less its header.
    """
    seen: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for state in states.values():
        for c in state["active"]:
            key = (c["group"], c["seq"])
            if key not in seen or c["entered_ns"] < seen[key]["entered_ns"]:
                seen[key] = c
    for c in sorted(seen.values(), key=lambda c: c["entered_ns"]):
        if (now_ns - c["entered_ns"]) / 1e9 < hang_after_s:
            break
        found = _candidate(states, world_size, c, now_ns)
        if found is not None:
            return found
    return None


def script_frame(stack: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The innermost frame outside torch, opscope and the standard library (``"lib"``).

    >>> script_frame([{"file": "train.py", "line": 3, "function": "main", "lib": False},
    ...               {"file": "torch/x.py", "line": 9, "function": "f", "lib": True}])["line"]
    3
    """
    for frame in reversed(stack):
        if not frame.get("lib", False):
            return frame
    return stack[-1] if stack else None


def _place(entry: Dict[str, Any]) -> str:
    frame = script_frame(entry["stack"])
    if not entry.get("answered", True):
        return "did not answer (dead, or its Python is stuck)"
    at = "" if frame is None else f" at {os.path.basename(frame['file'])}:{frame['line']}"
    now = entry.get("now_in")
    doing = ("not in a collective" if now is None else
             f"in {now['op']} #{now['seq']} of group {now['group']}")
    return doing + at


def hang_line(hang: Dict[str, Any], path: str) -> str:
    """The one stderr line that names a hang.

    >>> print(hang_line({"group": "0", "group_desc": "default_pg", "seq": 5,
    ...     "op": "gloo:all_reduce", "seconds": 4.0, "inside": [{"rank": 0, "stack": []}],
    ...     "missing": [{"rank": 1, "answered": True, "now_in": None,
    ...                  "stack": [{"file": "/j/train.py", "line": 31, "function": "main"}]}]},
    ...     "out/hang.json"))
    opscope: hang: gloo:all_reduce #5 of group 0 (default_pg) entered by rank 0 4.0 s ago; missing: rank 1 (not in a collective at train.py:31); the job is left to its process group's timeout; details in out/hang.json
    """
    inside = ",".join(str(e["rank"]) for e in hang["inside"][:LINE_RANKS])
    if len(hang["inside"]) > LINE_RANKS:
        inside += f" and {len(hang['inside']) - LINE_RANKS} more"
    missing = "; ".join(f"rank {m['rank']} ({_place(m)})" for m in hang["missing"][:LINE_RANKS])
    if len(hang["missing"]) > LINE_RANKS:
        missing += f"; and {len(hang['missing']) - LINE_RANKS} more"
    desc = f" ({hang['group_desc']})" if hang.get("group_desc") else ""
    return (f"opscope: hang: {hang['op']} #{hang['seq']} of group {hang['group']}{desc} entered "
            f"by rank{'s' if len(hang['inside']) > 1 else ''} {inside} {hang['seconds']} s ago; "
            f"missing: {missing}; the job is left to its process group's timeout; details in "
            f"{path}")
