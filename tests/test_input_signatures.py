"""Grouping recorded inputs by content (model/events.py:distinct_segments)."""

from __future__ import annotations

import numpy as np
import pytest

from opscope.model import events
from opscope.model.events import distinct_segments


def exact_groups(blob, offsets):
    """Reference: segments as bytes, numbered by first appearance."""
    bounds = sorted(set(offsets.tolist()))
    ends = {b: (bounds[k + 1] if k + 1 < len(bounds) else len(blob))
            for k, b in enumerate(bounds)}
    ids, group, firsts = {}, [], []
    for off in offsets.tolist():
        key = blob[off:ends[off]].tobytes()
        if key not in ids:
            ids[key] = len(ids)
            firsts.append((off, ends[off]))
        group.append(ids[key])
    return group, firsts


def random_blob(rng, n_segments):
    """Segments drawn from a few patterns, some offsets repeated or out of order."""
    patterns = [rng.integers(-5, 5, int(rng.integers(0, 6))) for _ in range(6)]
    parts, offsets, at = [], [], 0
    for _ in range(n_segments):
        p = patterns[int(rng.integers(0, len(patterns)))]
        offsets.append(at)
        parts.append(p)
        at += len(p)
    blob = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    offsets = np.array(offsets, dtype=np.int64)
    if rng.random() < 0.5:  # an event may share an offset, or come out of order
        offsets = np.concatenate([offsets, offsets[rng.integers(0, len(offsets), 5)]])
        rng.shuffle(offsets)
    return blob, offsets


@pytest.mark.parametrize("seed", range(20))
def test_groups_equal_grouping_by_bytes(seed):
    rng = np.random.default_rng(seed)
    blob, offsets = random_blob(rng, int(rng.integers(1, 200)))
    group, first, end = distinct_segments(blob, offsets)
    want_group, want_firsts = exact_groups(blob, offsets)
    assert group.tolist() == want_group
    got = [blob[a:b].tolist() for a, b in zip(first.tolist(), end.tolist())]
    assert got == [blob[a:b].tolist() for a, b in want_firsts]


def test_a_hash_collision_falls_back_to_exact_grouping(monkeypatch):
    # all-zero weights make every segment of one length hash alike
    monkeypatch.setattr(events, "hash_weights", lambda n: np.zeros(n, np.uint64))
    blob = np.array([1, 2, 3, 4, 1, 2], dtype=np.int64)
    group, first, end = distinct_segments(blob, np.array([0, 2, 4, 0]))
    assert group.tolist() == [0, 1, 0, 0]
    assert first.tolist() == [0, 2] and end.tolist() == [2, 4]


@pytest.mark.parametrize("list_length", [3, 250, 253, 254, 1000])
def test_decoding_with_and_without_the_end_agree(list_length):
    # decode_inputs without ``end`` reads a 256-word guess first; encodings that run
    # past it (a long int list) must be read whole, with or without a known end
    from opscope.model.records import decode_inputs, encode_plain_value

    words = [3]
    encode_plain_value(list(range(list_length)), words)
    encode_plain_value(7, words)
    encode_plain_value(True, words)
    blob = np.array(words + [99, 98], dtype=np.int64)  # trailing words of a next record
    known = decode_inputs(blob, 0, len(words))
    guessed = decode_inputs(blob, 0)
    assert known == guessed
    assert known.types == ["ScalarList", "Scalar", "Scalar"]
    assert known.concrete == [str(list(range(list_length))), "7", "True"]
