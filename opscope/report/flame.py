"""The flame graph (icicle): ``export_stacks``' paths folded into a tree.

The paths are those of ``opscope.analysis.collapsed.collapsed_stacks`` (the data
``prof.export_stacks`` writes), but user ranges come first: the enclosing user
ranges (``ProfilerStep*``, ``train_step``, module ranges; outermost first), then
the event's Python frames (root first) below the innermost such range's own
frames, then the enclosing ops, then the event (:func:`flame_paths`). So a range
is drawn once, over everything inside it, never under the frame that opened it
or under each op's frames. Frame names get their spaces back for display.
The ``ProfilerStep#N`` ranges merge into one ``ProfilerStep*`` frame (as
``key_averages`` merges them), so many steps still read as one profile.
Nodes below ``MIN_SHARE`` of the total are pruned (their time stays in the
parent's total) and the tree is capped at ``MAX_NODES`` nodes.

A node is ``[name index, total us, children]``. ``plumbing`` lists the name
indices of torch's call-machinery frames (``opscope.analysis.frames``), which
the page folds away by default (their children move up to their parent).

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> rows = [(0, 50_000, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0),
    ...         (10_000, 30_000, -1, 1, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)]
    >>> raw = RawSession(records_from_rows(rows), [], [1], ["my step", "aten::mm"],
    ...                  0, 60_000, 0)
    >>> f = flame_tree(build_session(raw))
    >>> f["names"], f["tree"], f["plumbing"]
    (['all', 'my step', 'aten::mm'], [0, 50.0, [[1, 50.0, [[2, 20.0, []]]]]], [])
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from opscope.analysis.aggregate import display_name
from opscope.analysis.frames import is_plumbing
from opscope.analysis.collapsed import frame_text
from opscope.model.records import FLAG_PYTHON_FUNCTION, SCOPE_USER
from opscope.model.session import ProfileSession

MIN_SHARE = 1e-4
MAX_NODES = 20_000
ROOT = "all"


class _Node:
    __slots__ = ("name", "total", "children")

    def __init__(self, name: int):
        self.name = name
        self.total = 0
        self.children: Dict[int, "_Node"] = {}


def _display_names(session: ProfileSession) -> Dict[str, str]:
    """Collapsed-stack frame text -> the original name it came from."""
    shown: Dict[str, str] = {}
    for name in session.table.symbols.names:
        shown.setdefault(frame_text(name), name)
    seen = set()
    for frames in session.stacks or ():
        if frames:
            for frame in frames:
                if frame not in seen:
                    seen.add(frame)
                    shown.setdefault(frame_text(frame), frame)
    return shown


def _below(frames: List[str], opener: Optional[List[str]]) -> List[str]:
    """Root-first ``frames`` past their common start with ``opener`` (a range's frames)."""
    k = 0
    if opener:
        while k < len(frames) and k < len(opener) and frames[k] == opener[k]:
            k += 1
    return frames[k:]


def flame_paths(session: ProfileSession) -> Dict[str, int]:
    """Path (``;``-joined, as collapsed stacks) -> self ns, user ranges first (module doc).

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> rows = [(0, 50_000, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0),
    ...         (10_000, 30_000, -1, 1, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)]
    >>> s = build_session(RawSession(records_from_rows(rows), [], [1], ["step", "aten::mm"],
    ...                              0, 60_000, 0))
    >>> s.stacks = [["t.py(3): main"], ["m.py(9): fwd", "t.py(4): main"]]
    >>> flame_paths(s)
    {'step': 30000, 'step;t.py(4):_main;m.py(9):_fwd;aten::mm': 20000}
    """
    table = session.table
    if len(table) == 0:
        return {}
    names = [frame_text(n) for n in table.symbols.names]
    is_range = ((table.scope == SCOPE_USER)
                & ((table.flags & FLAG_PYTHON_FUNCTION) == 0)).tolist()
    stacks = session.stacks
    values = table.self_ns.tolist()
    ranges: List[str] = [""] * len(table)  # the leading user ranges, joined
    ops: List[str] = [""] * len(table)  # the rest of the chain, joined
    opener: List[Optional[List[str]]] = [None] * len(table)  # innermost range's frames
    totals: Dict[str, int] = {}
    for i, (nid, p) in enumerate(zip(table.name_id.tolist(), table.parent.tolist())):
        frames = [frame_text(f) for f in reversed(stacks[i])] if stacks and stacks[i] else []
        if is_range[i] and (p < 0 or not ops[p]):  # a range no op encloses
            ranges[i] = names[nid] if p < 0 else ranges[p] + ";" + names[nid]
            opener[i] = frames or (opener[p] if p >= 0 else None)
            key = ranges[i]
        else:
            ranges[i] = ranges[p] if p >= 0 else ""
            opener[i] = opener[p] if p >= 0 else None
            ops[i] = names[nid] if p < 0 or not ops[p] else ops[p] + ";" + names[nid]
            key = ";".join(x for x in (ranges[i], ";".join(_below(frames, opener[i])), ops[i])
                           if x)
        if values[i] > 0:
            totals[key] = totals.get(key, 0) + values[i]
    return totals


def flame_tree(session: ProfileSession) -> Dict[str, Any]:
    """The icicle's tree (values in us) and its name list."""
    paths = flame_paths(session)
    shown = _display_names(session)
    names: List[str] = [ROOT]
    name_ids: Dict[str, int] = {}
    root = _Node(0)
    for key, ns in paths.items():
        root.total += ns
        node = root
        for part in key.split(";"):
            part = display_name(part)  # ProfilerStep#N -> ProfilerStep*
            nid = name_ids.get(part)
            if nid is None:
                nid = name_ids[part] = len(names)
                names.append(shown.get(part, part))
            child = node.children.get(nid)
            if child is None:
                child = node.children[nid] = _Node(nid)
            child.total += ns
            node = child
    floor = _floor(root, root.total * MIN_SHARE)
    budget = [MAX_NODES]

    def encode(node: _Node) -> list:
        budget[0] -= 1
        kids = sorted((c for c in node.children.values() if c.total >= floor),
                      key=lambda c: -c.total)
        out = []
        for child in kids:
            if budget[0] <= 0:
                break
            out.append(encode(child))
        return [node.name, round(node.total / 1000.0, 3), out]

    tree = encode(root)
    used = _used_names(tree)
    remap = {old: new for new, old in enumerate(sorted(used))}
    shown_names = [names[i] for i in sorted(used)]
    return {"names": shown_names, "tree": _renumber(tree, remap),
            "plumbing": [k for k, name in enumerate(shown_names) if is_plumbing(name)]}


def _floor(root: _Node, floor: float) -> float:
    """Raise ``floor`` so that about ``MAX_NODES`` nodes reach it (the largest ones)."""
    totals, todo = [], [root]
    while todo:
        node = todo.pop()
        totals.append(node.total)
        todo.extend(c for c in node.children.values() if c.total >= floor)
    if len(totals) > MAX_NODES:
        totals.sort(reverse=True)
        floor = max(floor, totals[MAX_NODES - 1])
    return floor


def _used_names(tree: list) -> set:
    used, todo = set(), [tree]
    while todo:
        node = todo.pop()
        used.add(node[0])
        todo.extend(node[2])
    return used


def _renumber(tree: list, remap: Dict[int, int]) -> list:
    return [remap[tree[0]], tree[1], [_renumber(c, remap) for c in tree[2]]]
