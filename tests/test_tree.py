"""Nesting rules: the vectorised tree equals torch's stack rule on any input."""

from __future__ import annotations

import numpy as np
import pytest

from opscope.analysis import tree
from opscope.model.events import EventTable, SymbolTable, sort_order
from opscope.model.records import FLAG_ASYNC


def make_table(start, end, thread, names=None, flags=None):
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    order = sort_order(start, end)
    n = len(start)
    cols = {c: np.zeros(n, dtype=np.int64) for c in EventTable.COLUMNS}
    cols["start_ns"], cols["end_ns"] = start[order], end[order]
    cols["thread_index"] = np.asarray(thread, np.int64)[order]
    cols["name_id"] = (np.asarray(names, np.int64) if names is not None else np.arange(n))[order]
    if flags is not None:
        cols["flags"] = np.asarray(flags, np.int64)[order]
    return EventTable(SymbolTable([f"n{i}" for i in range(n)]), cols)


def stack_rule(table):
    """Reference: torch's per-thread stack rule, written plainly."""
    parent = [-1] * len(table)
    for t in set(table.thread_index.tolist()):
        stack = []
        for i in range(len(table)):
            if table.thread_index[i] != t or table.is_async[i]:
                continue
            s, e = table.start_ns[i], table.end_ns[i]
            while stack and (s >= table.end_ns[stack[-1]] or e > table.end_ns[stack[-1]]):
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(i)
    return parent


def nested_intervals(rng, n, lo=0, hi=10_000):
    """A random properly nested family (with touching ends, ties and zero lengths)."""
    out = []

    def fill(lo, hi, budget):
        t = lo
        while budget > 0 and t < hi:
            s = int(rng.integers(t, hi + 1))
            e = int(rng.integers(s, min(hi, s + (hi - lo) // 2 + 1) + 1))
            out.append((s, e))
            budget -= 1
            if e - s > 2 and budget > 0:
                take = int(rng.integers(0, budget + 1))
                fill(s, e, take)
                budget -= take
            t = e if rng.random() < 0.7 else s + (e - s) // 2 + 1  # touch or overlap
        return budget

    fill(lo, hi, n)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_parents_equal_the_stack_rule(seed):
    rng = np.random.default_rng(seed)
    spans, threads = [], []
    for t in range(int(rng.integers(1, 4))):
        fam = nested_intervals(rng, int(rng.integers(1, 60)))
        spans += fam
        threads += [t] * len(fam)
    flags = [FLAG_ASYNC if rng.random() < 0.05 else 0 for _ in spans]
    table = make_table([s for s, _ in spans], [e for _, e in spans], threads, flags=flags)
    assert tree.assign_parents(table).tolist() == stack_rule(table)


def test_crossing_ranges_follow_torch_not_the_depth_sweep():
    # A [0,10] and B [5,15] cross: torch pops A, so B is a root and C [6,7] is B's child
    table = make_table([0, 5, 6], [10, 15, 7], [0, 0, 0])
    assert tree.assign_parents(table).tolist() == stack_rule(table) == [-1, -1, 1]


def test_touching_zero_length_and_identical_ranges():
    table = make_table([0, 10, 10, 10, 3, 3], [10, 20, 10, 20, 3, 3], [0] * 6)
    assert tree.assign_parents(table).tolist() == stack_rule(table)


def test_threads_do_not_nest_into_each_other():
    table = make_table([0, 1], [10, 2], [0, 1])
    assert tree.assign_parents(table).tolist() == [-1, -1]


def test_fold_and_self_time():
    # same-name only child folds into its parent; its children move up
    table = make_table([0, 1, 2, 5], [10, 9, 4, 6], [0] * 4, names=[0, 0, 1, 2])
    built = tree.build_tree(table)
    assert len(built) == 3
    assert built.parent.tolist() == [-1, 0, 0]
    assert built.self_ns.tolist() == [10 - 2 - 1, 2, 1]


def test_stable_order_matches_argsort_above_16_bits():
    keys = np.random.default_rng(3).integers(0, 1 << 20, 5000)
    assert tree._stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()
    small = keys % 7
    assert tree._stable_order(small).tolist() == np.argsort(small, kind="stable").tolist()


@pytest.mark.parametrize("seed", range(30))
def test_any_intervals_equal_the_stack_rule(seed):
    # crossing, nested, touching, zero-length and identical ranges on a few threads:
    # wherever the depth sweep's answer is accepted, it must be torch's
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 80))
    start = rng.integers(0, 40, n)
    end = start + rng.integers(0, 25, n) * (rng.random(n) < 0.9)
    thread = rng.integers(0, 3, n)
    table = make_table(start, end, thread)
    assert tree.assign_parents(table).tolist() == stack_rule(table)


def test_deep_nesting_with_siblings_is_accepted_by_the_depth_sweep():
    # a clean nesting never needs the stack rule: the sweep's own answer is checked
    table = make_table([0, 1, 2, 3, 5, 6, 20], [10, 9, 4, 3, 8, 7, 30], [0] * 7)
    found = tree._parents_by_depth(table.start_ns, table.end_ns)
    assert found is not None and found.tolist() == stack_rule(table)


def test_all_roots_checks_across_block_boundaries():
    start, end = np.array([0, 2, 4, 6]), np.array([2, 4, 7, 8])  # the third reaches past 6
    assert [tree._all_roots(start, end, step) for step in (1, 2, 3, 64)] == [False] * 4
    end[2] = 6
    assert [tree._all_roots(start, end, step) for step in (1, 2, 3, 64)] == [True] * 4
