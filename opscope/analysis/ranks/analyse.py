"""A multi-rank job as one profile: collectives matched across ranks, stragglers, desync.

``analyse_ranks(load_ranks(folder))`` reads the per-rank traces of a
torch.distributed job (opscope's or torch.profiler's, see
``opscope.analysis.ranks.facts``) and returns a :class:`RanksAnalysis`.

- **Matching.** Collectives of one process group are issued in the same order
  on every rank, so (group, sequence number) is their key. Both come with each
  collective's facts (``opscope.model.collective_facts``): from torch's flight
  recorder in an opscope recording (on by default in torch 2.13;
  ``opscope.analysis.flight_recorder``), or from the ``record_param_comms``
  args of a torch.profiler trace (NCCL's), subgroups included. A trace
  without them (torch.profiler's of a gloo job, a recording with
  ``TORCH_FR_BUFFER_SIZE=0``) falls back to the ordinal of the collective among
  the rank's collectives, all counted in the rank's default group
  (``pg_config[0].pg_name``, ``"0"``); a job whose subgroups issue their own
  collectives then shows them as a desync of the default group. Point-to-point
  ops (send, recv) involve two ranks, not the group: they count as
  communication but are not matched.
- **Wait and transfer** (the TensorBoard plugin's rule): the shortest duration
  of a collective across ranks is its transfer; the rest of each rank's
  duration is waiting for the others. A rank's wait is wall time: collectives
  in flight at once (DDP's bucket all-reduces) wait together, so their waits
  are counted once, and a rank never waits longer than it ran.
- **Stragglers** (``opscope.analysis.ranks.stragglers``): ranks late at the
  collectives by well beyond the job's own noise, again and again; the
  floor is ``min_lateness_ms`` and 5% of the median step time (of ranks with
  more than one step). Listed by total lateness, the latest first.
- **Desync.** The first (group, sequence number) where the ranks issued
  collectives of different kinds, element counts (in or out), dtypes or byte
  sizes, or some ranks none; with each rank's op, sizes and call site.

Example::

    >>> from opscope.analysis.collectives import CollectiveCall as C
    >>> ms = 10 ** 6  # a: arrives at 0 ms, done at 500; b: arrives at 400, done at 500
    >>> a = RankFacts(0, steps=1, step_ns=1000 * ms,
    ...               calls=[C("allreduce", 64, 0, 500 * ms, 500 * ms)])
    >>> b = RankFacts(1, steps=1, step_ns=1000 * ms,
    ...               calls=[C("allreduce", 64, 400 * ms, 500 * ms, 100 * ms)])
    >>> result = analyse_ranks([a, b])
    >>> [(s.rank, s.late_count, s.mean_lateness_ms) for s in result.stragglers]
    [(1, 1, 400.0)]
    >>> result.collectives[0].ranks[0].wait_ms, result.desync
    (400.0, [])
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from opscope.analysis.ranks.collective_keys import collective_sequences
from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.intervals import total, union
from opscope.analysis.ranks.checks import check_ranks
from opscope.analysis.ranks.facts import RankFacts
from opscope.analysis.ranks.stragglers import Straggler, find_stragglers

DEFAULT_MIN_LATENESS_MS = 1.0
STEP_FRACTION = 0.05  # lateness below this part of a step is noise
_MS = 1e6


def _ms(ns: float) -> float:
    return round(ns / _MS, 3)


@dataclass
class RankArrival:
    """One rank at one collective: arrival (ms after the job's first event), wait, transfer."""

    start_ms: float
    wait_ms: float
    transfer_ms: float
    kind: str
    bytes: Optional[int]
    call_site: Optional[str] = None
    in_nelems: Optional[int] = None  # its facts, where known (model.collective_facts)
    out_nelems: Optional[int] = None
    dtype: Optional[str] = None


@dataclass
class MatchedCollective:
    """A collective matched across ranks by (process group, sequence number)."""

    pg: str
    seq: int
    kind: str
    bytes: Optional[int]
    ranks: Dict[int, RankArrival]

    @property
    def max_wait_ms(self) -> float:
        return max((r.wait_ms for r in self.ranks.values()), default=0.0)


@dataclass
class RankSummary:
    """Per rank: steps, mean step time and where the time went (ms)."""

    rank: int
    steps: int
    mean_step_ms: float
    compute_ms: float
    comm_ms: float
    wait_ms: float
    overlap_ms: float
    collectives: int
    files: List[str] = field(default_factory=list)


@dataclass
class Desync:
    """Where the ranks' collectives first differ: per rank its kind (None: issued none)."""

    pg: str
    seq: int
    ranks: Dict[int, Optional[str]]
    bytes: Dict[int, Optional[int]]
    call_sites: Dict[int, Optional[str]]
    in_nelems: Dict[int, Optional[int]] = field(default_factory=dict)
    out_nelems: Dict[int, Optional[int]] = field(default_factory=dict)
    dtypes: Dict[int, Optional[str]] = field(default_factory=dict)


@dataclass
class RanksAnalysis:
    """Everything ``opscope ranks`` prints; ``to_json()`` is its ``--json`` document."""

    world_size: int
    ranks: List[RankSummary]
    collectives: List[MatchedCollective]
    stragglers: List[Straggler]
    desync: List[Desync]
    missing_ranks: List[int] = field(default_factory=list)  # below world_size, no trace

    def to_json(self) -> Dict[str, Any]:
        """Plain JSON types; rank keys of per-rank maps are strings, as JSON needs.

        >>> RanksAnalysis(1, [], [], [], []).to_json()["desync"]
        []
        """
        def keyed(d: Dict[int, Any]) -> Dict[str, Any]:
            return {str(k): v for k, v in d.items()}

        collectives = []
        for c in self.collectives:
            item = asdict(c)
            item["ranks"] = keyed({r: asdict(a) for r, a in c.ranks.items()})
            collectives.append(item)
        desync = [{"pg": d.pg, "seq": d.seq, "ranks": keyed(d.ranks), "bytes": keyed(d.bytes),
                   "call_sites": keyed(d.call_sites), "in_nelems": keyed(d.in_nelems),
                   "out_nelems": keyed(d.out_nelems), "dtypes": keyed(d.dtypes)}
                  for d in self.desync]
        return {"world_size": self.world_size, "ranks": [asdict(r) for r in self.ranks],
                "collectives": collectives,
                "stragglers": [asdict(s) for s in self.stragglers], "desync": desync,
                "missing_ranks": list(self.missing_ranks)}


def _match(pg: str, seqs: List[int], per_rank: Dict[int, List[Optional[CollectiveCall]]],
           origin: int, waits: Dict[int, List[Tuple[int, int]]]) -> List[MatchedCollective]:
    """The matched collectives of one group; adds each rank's wait spans to ``waits``."""
    out = []
    for i, seq in enumerate(seqs):
        here = {r: calls[i] for r, calls in per_rank.items() if calls[i] is not None}
        if not here:
            continue
        transfer = min(c.duration_ns for c in here.values())
        kind = Counter(c.kind for c in here.values()).most_common(1)[0][0]
        sizes = Counter(c.nbytes for c in here.values() if c.kind == kind)
        arrivals = {r: RankArrival(_ms(c.arrival_ns - origin), _ms(c.duration_ns - transfer),
                                   _ms(transfer), c.kind, c.nbytes, c.call_site, c.in_nelems,
                                   c.out_nelems, c.dtype)
                    for r, c in sorted(here.items())}
        for r, c in here.items():  # the wait comes first, the transfer ends the range
            begin = c.end_ns - c.duration_ns
            waits.setdefault(r, []).append((begin, begin + c.duration_ns - transfer))
        out.append(MatchedCollective(pg, seq, kind, sizes.most_common(1)[0][0], arrivals))
    return out


def _differ(present: List[CollectiveCall]) -> bool:
    """Whether the calls differ in kind, element counts, dtype or bytes (where known)."""
    return any(len({v for v in map(fact, present) if v is not None}) > 1 for fact in (
        lambda c: c.kind, lambda c: c.nbytes, lambda c: c.dtype,
        lambda c: None if c.in_nelems is None else (c.in_nelems, c.out_nelems)))


def _first_desync(pg: str, seqs: List[int],
                  per_rank: Dict[int, List[Optional[CollectiveCall]]]) -> Optional[Desync]:
    for i, seq in enumerate(seqs):
        here = {r: calls[i] for r, calls in per_rank.items()}
        present = [c for c in here.values() if c is not None]
        if len(present) < len(here) or _differ(present):
            ranks = sorted(here)

            def each(fact):
                return {r: fact(here[r]) if here[r] else None for r in ranks}

            return Desync(pg, seq, each(lambda c: c.kind), each(lambda c: c.nbytes),
                          each(lambda c: c.call_site), each(lambda c: c.in_nelems),
                          each(lambda c: c.out_nelems), each(lambda c: c.dtype))
    return None


def analyse_ranks(facts: Sequence[RankFacts], *,
                  min_lateness_ms: float = DEFAULT_MIN_LATENESS_MS) -> RanksAnalysis:
    """Match the ranks' collectives and find stragglers and the first desync.

    ``facts`` is what :func:`load_ranks` returns (one entry per rank).
    Times in the result are ms; arrivals count from the job's first event.

    Ranks and times out of bounds (``opscope.analysis.ranks.checks``) raise
    RankTraceError: nothing is sized by a rank number.

    >>> analyse_ranks([RankFacts(0, world_size=2)]).missing_ranks
    [1]
    """
    check_ranks(facts)
    starts = [f.start_ns for f in facts if f.start_ns is not None]
    origin = min(starts) if starts else 0
    collectives: List[MatchedCollective] = []
    desync: List[Desync] = []
    spans: Dict[int, List[Tuple[int, int]]] = {}
    for pg, (seqs, per_rank) in sorted(collective_sequences(facts).items()):
        collectives += _match(pg, seqs, per_rank, origin, spans)
        first = _first_desync(pg, seqs, per_rank)
        if first is not None:
            desync.append(first)
    wait = {r: total(union(*np.array(v, dtype=np.int64).reshape(-1, 2).T))
            for r, v in spans.items()}
    ranks = [RankSummary(
        f.rank, f.steps, _ms(f.step_ns / f.steps) if f.steps else 0.0, _ms(f.compute_ns),
        _ms(f.comm_ns), _ms(wait.get(f.rank, 0)), _ms(f.overlap_ns), len(f.calls),
        list(f.paths)) for f in facts]
    sizes = [f.world_size for f in facts if f.world_size]
    world = max(sizes + [max((f.rank for f in facts), default=-1) + 1])
    stepped = [r.mean_step_ms for r in ranks if r.steps > 1]
    floor = max(min_lateness_ms, STEP_FRACTION * statistics.median(stepped) if stepped else 0)
    found = {f.rank for f in facts}
    late = find_stragglers([{r: a.start_ms for r, a in c.ranks.items()} for c in collectives],
                           floor_ms=floor)
    return RanksAnalysis(world, ranks, collectives, late, desync,
                         [r for r in range(world) if r not in found])
