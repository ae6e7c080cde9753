"""Line the ranks' collectives up by (process group, sequence number).

Two rules (``opscope.analysis.ranks.analyse`` explains why):

- with the flight recorder's keys on every collective
  (``opscope.analysis.flight_recorder``): each collective sits at its own
  ``collective_seq_id`` in its own group, subgroups included; a group's
  members come from ``distributedInfo.pg_config``;
- without them: the ordinal of each collective among the rank's collectives,
  all in the rank's default group.

Either way the result is, per group, its sequence numbers and per rank the
collective it issued at each (None: none).

>>> from opscope.analysis.collectives import CollectiveCall as C
>>> from opscope.analysis.ranks.facts import RankFacts
>>> a = RankFacts(0, calls=[C("allreduce", 8, 0, 1, 1, pg="0", seq=7),
...                         C("allreduce", 8, 2, 3, 1, pg="1", seq=1)])
>>> b = RankFacts(1, calls=[C("allreduce", 8, 0, 1, 1, pg="0", seq=7)])
>>> seqs = collective_sequences([a, b])
>>> seqs["0"][0], sorted(seqs["0"][1]), seqs["1"][0], sorted(seqs["1"][1])
([7], [0, 1], [1], [0])
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.ranks.facts import RankFacts
from opscope.model.torch_names import POINT_TO_POINT_KINDS

# group -> (its sequence numbers, rank -> its collective at each one, None where none)
Sequences = Dict[str, Tuple[List[int], Dict[int, List[Optional[CollectiveCall]]]]]


def collective_sequences(facts: Sequence[RankFacts]) -> Sequences:
    """Each group's collectives, lined up across its ranks (see the module docstring)."""
    calls = {f.rank: [c for c in f.calls if c.kind not in POINT_TO_POINT_KINDS]
             for f in facts}
    everyone = [c for cs in calls.values() for c in cs]
    if everyone and all(c.seq is not None and c.pg is not None for c in everyone):
        return _by_recorder(facts, calls)
    return _by_ordinal(facts, calls)


def _by_ordinal(facts: Sequence[RankFacts],
                calls: Dict[int, List[CollectiveCall]]) -> Sequences:
    groups: Dict[str, Dict[int, List[CollectiveCall]]] = {}
    for f in facts:
        groups.setdefault(f.group, {})[f.rank] = calls[f.rank]
    out: Sequences = {}
    for pg, per_rank in groups.items():
        n = max((len(c) for c in per_rank.values()), default=0)
        out[pg] = (list(range(n)), {r: list(c) + [None] * (n - len(c))
                                    for r, c in per_rank.items()})
    return out


def _by_recorder(facts: Sequence[RankFacts],
                 calls: Dict[int, List[CollectiveCall]]) -> Sequences:
    keyed: Dict[str, Dict[int, Dict[int, CollectiveCall]]] = {}
    members: Dict[str, Set[int]] = {}
    present = {f.rank for f in facts}
    for f in facts:
        for c in calls[f.rank]:
            keyed.setdefault(str(c.pg), {}).setdefault(f.rank, {})[int(c.seq)] = c
        for pg, ranks in f.group_ranks.items():
            members.setdefault(pg, set()).update(r for r in ranks if r in present)
    out: Sequences = {}
    for pg, per_rank in keyed.items():
        ranks = sorted(set(per_rank) | members.get(pg, set()))
        # a window starts at different numbers on different ranks: from the latest start
        first = max(min(d) for d in per_rank.values())
        seqs = sorted({s for d in per_rank.values() for s in d if s >= first})
        out[pg] = (seqs, {r: [per_rank.get(r, {}).get(s) for s in seqs] for r in ranks})
    return out
