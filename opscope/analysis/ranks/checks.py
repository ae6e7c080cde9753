"""Checks on rank traces before they are analysed together: one run, bounded ranks and times.

Rank traces may come from anyone (a shared folder, a copied job), so before
their facts are added up:

- **One run.** A folder may hold the traces of two runs of a job (rank 0 of
  yesterday's run and of today's). Their steps and collectives must not add up.
  A run's rank is one process, and each trace names it: ``distributedInfo``'s
  ``world_size`` and the events' ``pid`` (torch.profiler's and opscope's
  traces both carry them; ``trace_id`` is new in every file, so it tells
  nothing). Two traces of one rank from different processes or world sizes, or
  ranks that disagree on the world size, are refused in one line naming two
  of the files: :func:`check_one_run` (``ranks``, ``report`` and ``merge``).
  (A rank restarted by torchelastic is a new process too: give each attempt's
  traces on their own.)
- **Bounded ranks.** A rank must be below its trace's ``world_size``, and both
  at most ``MAX_RANKS``; nothing is then sized by a forged rank number such as
  2,000,000,000: :func:`check_ranks`.
- **Bounded times.** A trace's times moved by its clock offset
  (``opscopeClockOffsetNs``) must stay within ``MAX_ALIGNED_NS`` of the epoch,
  so 64-bit arithmetic never overflows: :func:`check_times`.

Each failure is a ``RankTraceError`` (``opscope.load.ranks``, whose file checks raise it
too; the CLI prints it as one line and exits 2).

Example::

    >>> check_rank_number("t.json", 3, world_size=2)
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: trace 't.json': rank 3 is not below its world size 2
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Sequence

from opscope.load.ranks import RankTraceError
from opscope.model.session import ProfileSession

MAX_RANKS = 1 << 20  # 1,048,576 ranks: beyond any job run so far
MAX_ALIGNED_NS = 1 << 62  # aligned ns (about 146 years either side of 1970)


def check_rank_number(path: str, rank: int, world_size: Optional[int]) -> None:
    """Refuse a rank at or past its world size, or past ``MAX_RANKS``.

    >>> check_rank_number("t.json", 2_000_000_000, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: trace 't.json': rank 2000000000 is over ...
    """
    if world_size is not None and not 0 < world_size <= MAX_RANKS:
        raise RankTraceError(f"trace {path!r}: world size {world_size} is outside 1.."
                             f"{MAX_RANKS}, the most ranks opscope analyses")
    if world_size is not None and rank >= world_size:
        raise RankTraceError(f"trace {path!r}: rank {rank} is not below its world size "
                             f"{world_size}")
    if rank >= MAX_RANKS:
        raise RankTraceError(f"trace {path!r}: rank {rank} is over {MAX_RANKS - 1}, the "
                             f"highest rank opscope analyses")


def check_ranks(facts: Sequence[Any]) -> None:
    """``facts.RankFacts`` of each rank (traces or a store): every rank within bounds and
    every time within ``MAX_ALIGNED_NS``."""
    for f in facts:
        where = f.paths[0] if f.paths else f"rank {f.rank}"
        check_rank_number(where, f.rank, f.world_size)
        times = [t for t in (f.start_ns, f.end_ns) if t is not None]
        times += [t for c in f.calls for t in (c.arrival_ns, c.end_ns)]
        if times and not -MAX_ALIGNED_NS <= min(times) <= max(times) <= MAX_ALIGNED_NS:
            raise RankTraceError(f"trace {where!r}: its aligned times are out of range "
                                 f"(beyond {MAX_ALIGNED_NS} ns from 1970); expected plausible "
                                 f"timestamps and clock offset")


def check_times(path: str, session: ProfileSession, offset_ns: int) -> None:
    """Refuse a trace whose times moved by ``offset_ns`` would leave ``MAX_ALIGNED_NS``.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> s = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> check_times("t.json", s, 2 ** 63)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: trace 't.json': its clock offset ...
    """
    shift = session.epoch_offset_ns + offset_ns
    table = session.table
    ends = [shift]
    if len(table):
        ends = [int(table.start_ns.min()) + shift, int(table.end_ns.max()) + shift]
    if abs(offset_ns) > MAX_ALIGNED_NS or not all(abs(t) <= MAX_ALIGNED_NS for t in ends):
        raise RankTraceError(f"trace {path!r}: its clock offset (opscopeClockOffsetNs "
                             f"{offset_ns}) or timestamps put its events beyond "
                             f"{MAX_ALIGNED_NS} ns from 1970; expected plausible ones")


class RunMark(NamedTuple):
    """What tells one trace's run: its rank, file, process id and world size (None: unknown)."""

    rank: int
    path: str
    process_id: Optional[int]
    world_size: Optional[int]


def check_one_run(marks: Sequence[RunMark]) -> None:
    """Refuse traces of several runs: see the module docstring. ``marks``: one per trace.

    >>> check_one_run([RunMark(0, "a.json", 100, 2), RunMark(0, "b.json", 200, 2)])
    Traceback (most recent call last):
    ...
    opscope.load.ranks.RankTraceError: 'a.json' and 'b.json' are rank 0 of two runs \
(pid 100, world size 2; pid 200, world size 2): the traces mix runs of a job; give one run's \
traces (a folder per run)
    """
    first_of_rank: Dict[int, RunMark] = {}
    sized: Optional[RunMark] = None
    for mark in sorted(marks, key=lambda m: (m.rank, m.path)):
        first = first_of_rank.setdefault(mark.rank, mark)
        if _differs(first.process_id, mark.process_id) or \
                _differs(first.world_size, mark.world_size):
            raise _mixed(first, mark, f"rank {mark.rank} of two runs ({_shown(first)}; "
                                      f"{_shown(mark)})")
        sized = sized or (mark if mark.world_size is not None else None)
        if sized is not None and _differs(sized.world_size, mark.world_size):
            raise _mixed(sized, mark, f"ranks {sized.rank} and {mark.rank} of two runs (world "
                                      f"size {sized.world_size} and {mark.world_size})")


def _differs(a: Optional[int], b: Optional[int]) -> bool:
    return a is not None and b is not None and a != b


def _shown(mark: RunMark) -> str:
    pid, world = mark.process_id, mark.world_size
    return f"pid {pid if pid is not None else '?'}, world size {world if world is not None else '?'}"


def _mixed(a: RunMark, b: RunMark, what: str) -> RankTraceError:
    return RankTraceError(f"{a.path!r} and {b.path!r} are {what}: the traces mix runs "
                          f"of a job; give one run's traces (a folder per run)")
