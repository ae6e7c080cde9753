"""The flame graph (icicle): ``export_stacks``' paths folded into a tree.

The paths and values are ``opscope.export.stacks.collapsed_stacks``, the data
``prof.export_stacks`` writes: Python frames (root first), then the enclosing
ranges and ops, then the op. Frame names get their spaces back for display.
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

from typing import Any, Dict, List

from opscope.analysis.aggregate import display_name
from opscope.analysis.frames import is_plumbing
from opscope.export.stacks import collapsed_stacks, frame_text
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


def flame_tree(session: ProfileSession) -> Dict[str, Any]:
    """The icicle's tree (values in us) and its name list."""
    paths = collapsed_stacks(session)
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
