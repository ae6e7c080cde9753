"""``opscope ranks`` says why a collective's size is ``?`` (issue 27, item 19)."""

from __future__ import annotations

from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.analysis.ranks.facts import RankFacts
from opscope.export.ranks_text import format_ranks


def job(nbytes):
    ms = 10 ** 6
    calls = [CollectiveCall("allreduce", nbytes, 0, ms, ms)]
    return analyse_ranks([RankFacts(0, calls=calls), RankFacts(1, calls=list(calls))])


def test_an_unknown_size_is_explained():
    text = format_ranks(job(None))
    assert " ? " in text and "record_shapes=True" in text


def test_a_known_size_needs_no_note():
    text = format_ranks(job(64))
    assert "64 B" in text and "record_shapes" not in text
