"""Memory blocks, their categories, and the timeline torch's exporter writes.

A *block* is one allocation: from its allocation record (or the start of the
window, for memory that existed before) to its free (or the end). Its
category comes from what was observed, never from a guess:

1. a sighting (``opscope.collect.memory_hooks``) of a tensor whose storage is
   the block: PARAMETER, OPTIMIZER_STATE, GRADIENT or INPUT, the first of
   these in that order when several apply;
2. else TEMPORARY, when it is allocated and freed within one op (an aten op
   whose interval holds both, on one thread);
3. else ACTIVATION, when it is allocated outside backward and freed inside it:
   autograd frees what a node saved for backward as that node runs;
4. else AUTOGRAD_DETAIL, when it is allocated inside backward and is no
   parameter's ``.grad``;
5. else unknown.

Example::

    >>> import numpy as np
    >>> from opscope.model.records import MEMORY_DTYPE
    >>> mem = np.zeros(2, MEMORY_DTYPE)
    >>> mem["time_ns"], mem["addr"], mem["bytes"] = [10, 20], [64, 64], [512, -512]
    >>> blocks = pair_blocks(mem)
    >>> blocks.t_alloc.tolist(), blocks.t_free.tolist(), blocks.nbytes.tolist()
    ([10], [20], [512])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from opscope.analysis.ancestry import nearest_marked
from opscope.analysis.autograd_links import backward_marks
from opscope.model.memory import (ACTIVATION, AUTOGRAD_DETAIL, CATEGORY_NAMES,
                                  SIGHTING_DTYPE, SIGHTING_PRIORITY, TEMPORARY, UNKNOWN)
from opscope.model.records import SCOPE_FUNCTION
from opscope.model.session import ProfileSession

BEFORE = -1  # t_alloc of memory that existed before the window
ALIVE = -1  # t_free of memory still held at the end
# torch's colours per category, in plot order (the timeline page and the report's Memory view)
COLORS = ("darkgreen", "goldenrod", "black", "mediumpurple", "red", "mediumblue", "royalblue",
          "grey")


@dataclass
class Blocks:
    """Parallel arrays, one entry per block. Record indices are -1 where absent."""

    addr: np.ndarray
    nbytes: np.ndarray
    t_alloc: np.ndarray
    t_free: np.ndarray
    device_type: np.ndarray
    device_index: np.ndarray
    alloc_record: np.ndarray
    free_record: np.ndarray
    category: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.addr)


def _device_key(device_type: np.ndarray, device_index: np.ndarray, addr: np.ndarray) -> np.ndarray:
    return ((device_type.astype(np.int64) & 0x7F) << 56) | ((device_index.astype(np.int64) & 0xFF)
                                                            << 48) | addr.astype(np.int64)


def pair_blocks(memory: np.ndarray) -> Blocks:
    """Match each allocation with the next free of its address on its device."""
    n = len(memory)
    key = _device_key(memory["device_type"], memory["device_index"], memory["addr"])
    t = memory["time_ns"]
    if n < 2 or bool((t[1:] >= t[:-1]).all()):  # records in time order (one thread): a
        order = np.argsort(key, kind="stable")  # stable sort by key keeps it (4M: 3x faster)
    else:  # by key, then time, then record (lexsort is stable)
        order = np.lexsort((t, key))
    k, b = key[order], memory["bytes"][order]
    is_alloc = b > 0
    nxt_same = np.zeros(n, bool)
    nxt_same[:-1] = k[1:] == k[:-1]
    nxt_free = np.zeros(n, bool)
    nxt_free[:-1] = b[1:] < 0
    paired = is_alloc & nxt_same & nxt_free
    prev_paired = np.zeros(n, bool)
    prev_paired[1:] = paired[:-1]
    allocs = np.flatnonzero(is_alloc)
    lone_frees = np.flatnonzero((b < 0) & ~prev_paired)  # freed memory allocated before
    alloc_rec = order[allocs]
    free_of_alloc = np.where(paired[allocs], order[np.minimum(allocs + 1, n - 1)], -1)
    rec_a = np.concatenate([alloc_rec, np.full(len(lone_frees), -1)])
    rec_f = np.concatenate([free_of_alloc, order[lone_frees]])
    src = np.where(rec_a >= 0, rec_a, rec_f)
    return Blocks(
        addr=memory["addr"][src].astype(np.int64),
        nbytes=np.abs(memory["bytes"][src]).astype(np.int64),
        t_alloc=np.where(rec_a >= 0, t[np.maximum(rec_a, 0)], BEFORE).astype(np.int64),
        t_free=np.where(rec_f >= 0, t[np.maximum(rec_f, 0)], ALIVE).astype(np.int64),
        device_type=memory["device_type"][src].astype(np.int64),
        device_index=memory["device_index"][src].astype(np.int64),
        alloc_record=rec_a.astype(np.int64),
        free_record=rec_f.astype(np.int64),
    )


def _add_sighted(blocks: Blocks, sightings: np.ndarray) -> Tuple[Blocks, np.ndarray]:
    """Block index per sighting (-1: none), adding blocks for pre-existing tensors.

    A sighting belongs to the last block of its address (and device) allocated at or
    before it, if that block is not freed before it. One with no such block saw
    memory from before the window: the first of these per address (in sighting
    order) with a known size adds a block, alive until the address is next
    allocated; the later ones belong to it. Blocks and sightings are sorted together
    by (address, time), so each finds its block by position.
    """
    hit = np.full(len(sightings), -1, dtype=np.int64)
    if not len(sightings):
        return blocks, hit
    nb, ns = len(blocks), len(sightings)
    key = _device_key(blocks.device_type, blocks.device_index, blocks.addr)
    s_key = _device_key(sightings["device_type"], sightings["device_index"], sightings["addr"])
    s_time = sightings["time_ns"].astype(np.int64)
    all_key = np.concatenate([key, s_key])
    # at one time, blocks before sightings (a block allocated then holds the tensor seen),
    # and among blocks of one time the later one last
    order = np.lexsort((np.concatenate([np.arange(nb), np.arange(ns)]),
                        np.concatenate([np.zeros(nb, np.int8), np.ones(ns, np.int8)]),
                        np.concatenate([blocks.t_alloc, s_time]), all_key))
    sorted_key = all_key[order]
    is_block = order < nb
    places = np.arange(len(order))
    last_block = np.maximum.accumulate(np.where(is_block, places, -1))
    next_block = np.minimum.accumulate(np.where(is_block, places, len(order))[::-1])[::-1]
    seen = np.flatnonzero(~is_block)
    s_ids = order[seen] - nb
    prev = last_block[seen]
    has_prev = (prev >= 0) & (sorted_key[np.maximum(prev, 0)] == sorted_key[seen])
    block = order[prev[has_prev]]
    t_free = blocks.t_free[block]
    held = (t_free == ALIVE) | (t_free >= s_time[s_ids[has_prev]])
    hit[s_ids[has_prev][held]] = block[held]
    # the sightings of memory from before the window, in sighting order
    todo = np.argsort(s_ids[~has_prev], kind="stable")
    before_ids, before_next = s_ids[~has_prev][todo], next_block[seen[~has_prev]][todo]
    nbytes = sightings["bytes"]
    new_rows: List[Tuple[int, int, int, int, int]] = []  # addr, bytes, t_free, device
    created: Dict[int, int] = {}
    for j, nxt in zip(before_ids.tolist(), before_next.tolist()):
        k = int(s_key[j])
        if k in created:
            hit[j] = created[k]
            continue
        if nbytes[j] < 0:  # size unknown (a saved tensor): only in-window blocks match
            continue
        # existed before the window: alive until its address is allocated again
        end = int(blocks.t_alloc[order[nxt]]) if nxt < len(order) and \
            sorted_key[nxt] == k else ALIVE
        idx = nb + len(new_rows)
        new_rows.append((k & ((1 << 48) - 1), int(nbytes[j]), end,
                         int(sightings["device_type"][j]), int(sightings["device_index"][j])))
        created[k] = idx
        hit[j] = idx
    if new_rows:
        add = np.array(new_rows, dtype=np.int64)
        blocks = Blocks(
            addr=np.concatenate([blocks.addr, add[:, 0]]),
            nbytes=np.concatenate([blocks.nbytes, add[:, 1]]),
            t_alloc=np.concatenate([blocks.t_alloc, np.full(len(add), BEFORE)]),
            t_free=np.concatenate([blocks.t_free, add[:, 2]]),
            device_type=np.concatenate([blocks.device_type, add[:, 3]]),
            device_index=np.concatenate([blocks.device_index, add[:, 4]]),
            alloc_record=np.concatenate([blocks.alloc_record, np.full(len(add), -1)]),
            free_record=np.concatenate([blocks.free_record, np.full(len(add), -1)]),
        )
    return blocks, hit


def categorized_blocks(session: ProfileSession,
                       sightings: Optional[np.ndarray] = None) -> Blocks:
    """Every block of the session with its category (model.memory codes)."""
    memory = session.memory if session.memory is not None else np.zeros(0)
    if sightings is None:
        sightings = session.memory_sightings
    if sightings is None:
        sightings = np.zeros(0, SIGHTING_DTYPE)
    blocks = pair_blocks(memory) if len(memory) else pair_blocks(_empty_memory())
    blocks, hit = _add_sighted(blocks, sightings)
    rank = np.full(len(blocks), len(SIGHTING_PRIORITY), dtype=np.int64)
    order_of = np.full(8, len(SIGHTING_PRIORITY), dtype=np.int64)
    order_of[list(SIGHTING_PRIORITY)] = np.arange(len(SIGHTING_PRIORITY))
    ok = hit >= 0
    np.minimum.at(rank, hit[ok], order_of[sightings["category"][ok].astype(np.int64)])
    category = np.full(len(blocks), UNKNOWN, dtype=np.int64)
    seen = rank < len(SIGHTING_PRIORITY)
    category[seen] = np.asarray(SIGHTING_PRIORITY)[rank[seen]]
    _unsighted_categories(session, blocks, category, ~seen)
    blocks.category = category
    return blocks


def _unsighted_categories(session: ProfileSession, blocks: Blocks, category: np.ndarray,
                          todo: np.ndarray) -> None:
    owner = session.memory_owner
    table = session.table
    if owner is None or not todo.any() or len(table) == 0:
        return
    a_rec, f_rec = blocks.alloc_record, blocks.free_record
    a_owner = np.where(a_rec >= 0, owner[np.maximum(a_rec, 0)], -1)
    f_owner = np.where(f_rec >= 0, owner[np.maximum(f_rec, 0)], -1)
    # TEMPORARY: climb from the allocating op to the first op still open at the free
    cand = np.where(todo & (a_owner >= 0) & (f_owner >= 0), a_owner, -1)
    t_free = blocks.t_free
    while True:
        climb = (cand >= 0) & (table.end_ns[np.maximum(cand, 0)] < t_free)
        if not climb.any():
            break
        cand[climb] = table.parent[cand[climb]]
    same_thread = (cand >= 0) & (table.thread_index[np.maximum(cand, 0)]
                                 == table.thread_index[np.maximum(f_owner, 0)])
    temp = same_thread & (table.scope[np.maximum(cand, 0)] == SCOPE_FUNCTION)
    category[temp] = TEMPORARY
    in_bwd = in_backward(table)
    alloc_bwd = (a_owner >= 0) & in_bwd[np.maximum(a_owner, 0)]
    free_bwd = (f_owner >= 0) & in_bwd[np.maximum(f_owner, 0)]
    # autograd releases what a node saved as the node runs: memory made outside
    # backward and freed inside it was held for backward
    saved = todo & ~temp & ~alloc_bwd & free_bwd
    category[saved] = ACTIVATION
    category[todo & ~temp & alloc_bwd] = AUTOGRAD_DETAIL


def in_backward(table) -> np.ndarray:
    """True for events run by the autograd engine: backward nodes, the engine's
    ``evaluate_function`` ranges, and everything under them."""
    nodes, wrappers = backward_marks(table)
    return nearest_marked(table.parent, nodes | wrappers) >= 0


def _empty_memory() -> np.ndarray:
    from opscope.model.records import MEMORY_DTYPE

    return np.zeros(0, MEMORY_DTYPE)


def parse_device(device: str) -> Tuple[int, int]:
    """(c10 device type, index) of "cpu", "cuda" or "cuda:N", as the allocator reports them.

    >>> parse_device("cpu"), parse_device("cuda:1")
    ((0, -1), (1, 1))
    """
    kind, _, index = str(device).partition(":")
    if kind == "cpu" and not index:
        return 0, -1
    if kind == "cuda" and (not index or index.isdigit()):
        return 1, int(index or 0)
    raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def device_filter(blocks: Blocks, device: str) -> np.ndarray:
    """Blocks on ``device`` ("cpu", "cuda", "cuda:1")."""
    kind, index = parse_device(device)
    pick = blocks.device_type == kind
    if kind != 0:
        pick &= blocks.device_index == index
    return pick


def held_by_category(blocks: Blocks, pick: np.ndarray, before: int,
                     to_time: Callable[[np.ndarray], np.ndarray] = lambda t: t
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """Distinct times and, from each on, the bytes held per category (one column per
    model.memory code) by the ``pick``-ed blocks. ``to_time`` maps collector ns to
    the output's time unit; memory from before the window is held from ``before``."""
    ta, tf = blocks.t_alloc[pick], blocks.t_free[pick]
    nb, cat = blocks.nbytes[pick], blocks.category[pick]
    start = np.where(ta == BEFORE, before, to_time(ta))
    freed = tf != ALIVE
    times = np.concatenate([start, to_time(tf[freed])])
    delta = np.concatenate([nb, -nb[freed]])
    column = np.concatenate([cat, cat[freed]])
    uniq, slot = np.unique(times, return_inverse=True)
    grid = np.zeros((len(uniq), len(CATEGORY_NAMES)), dtype=np.int64)
    np.add.at(grid, (slot.reshape(-1), column), delta)
    return uniq, np.cumsum(grid, axis=0)


def timeline(session: ProfileSession, device: str = "cpu",
             blocks: Optional[Blocks] = None) -> Tuple[List[int], List[List[int]]]:
    """``(times, sizes)`` as torch's ``export_memory_timeline`` writes them.

    Times are Unix µs; each sizes row has 9 columns: an unused 0, then the
    bytes held by each category at that time (model.memory codes + 1).
    """
    blocks = blocks if blocks is not None else categorized_blocks(session)
    pick = device_filter(blocks, device)
    if not pick.any():
        return [], []
    ta, tf = blocks.t_alloc[pick], blocks.t_free[pick]
    us = lambda t: (t + session.epoch_offset_ns) // 1000  # noqa: E731
    t_first = min(int(ta[ta != BEFORE].min(initial=1 << 62)), int(tf[tf != ALIVE].min(
        initial=1 << 62)))
    t_min = us(t_first) if t_first != 1 << 62 else us(session.start_ns)
    times, held = held_by_category(blocks, pick, t_min, us)
    sizes = np.hstack([np.zeros((len(times), 1), dtype=np.int64), held])
    return times.tolist(), sizes.tolist()


def raw_timeline(session: ProfileSession, device: str = "cpu",
                 blocks: Optional[Blocks] = None) -> List[Tuple[int, int, int, int]]:
    """``(time_ns, action, bytes, category)`` rows, torch's ``.raw.json.gz`` layout.

    Pre-existing memory has time -1 and action PREEXISTING; frees have
    negative bytes. Times are Unix ns.
    """
    from opscope.model.memory import ACTION_CREATE, ACTION_DESTROY, ACTION_PREEXISTING

    blocks = blocks if blocks is not None else categorized_blocks(session)
    pick = device_filter(blocks, device)
    rows: List[Tuple[int, int, int, int]] = []
    off = session.epoch_offset_ns
    for ta, tf, nb, cat in zip(blocks.t_alloc[pick].tolist(), blocks.t_free[pick].tolist(),
                               blocks.nbytes[pick].tolist(), blocks.category[pick].tolist()):
        if ta == BEFORE:
            rows.append((-1, ACTION_PREEXISTING, nb, cat))
        else:
            rows.append((ta + off, ACTION_CREATE, nb, cat))
        if tf != ALIVE:
            rows.append((tf + off, ACTION_DESTROY, -nb, cat))
    rows.sort()
    return rows
