"""A store's ranks as ``RankFacts``, read with DuckDB: what ``opscope ranks STORE`` analyses.

``store_rank_facts(con)`` rebuilds, per rank, the facts ``load_ranks`` computes from
a folder of rank traces: the per-window ``rank_facts`` of the ``sessions`` view added
up window after window (as ``RankFacts.add`` adds a rank's traces), and the rank's
calls from the ``collectives`` view, in the order they were written (arrival order).
Both tables are small (one row per window, one per collective), so no event is read:
``analyse_ranks`` of the result is the folder's analysis.

``load_store_job(store, con, visit)`` is ``analysis.ranks.job.load_job`` for a store (the job
report): the same facts, plus each window's session loaded one at a time
(``load_store_session``) for the step times, the timeline and the shown rank.

Example::

    >>> facts = facts_of_window(1, "a.json", 2, '{"steps": 3, "step_ns": 30, '
    ...     '"compute_ns": 5, "comm_ns": 4, "overlap_ns": 1, "start_ns": 10, "end_ns": 90, '
    ...     '"group": "0", "group_ranks": {"0": [0, 1]}}', "s")
    >>> facts.rank, facts.world_size, facts.steps, facts.group_ranks
    (1, 2, 3, {'0': [0, 1]})
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.ranks.facts import DEFAULT_GROUP, RankFacts
from opscope.store.schema import StoreError, load_json

_INT_FACTS = ("steps", "step_ns", "compute_ns", "comm_ns", "overlap_ns")


def _int_or_none(value) -> Optional[int]:
    return value if type(value) is int else None


def facts_of_window(rank: int, path: str, world_size: Optional[int], text: Optional[str],
                    store: str) -> RankFacts:
    """The RankFacts of one window from its ``sessions.rank_facts`` JSON (calls apart)."""
    try:
        doc = load_json(text) if text else {}
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise StoreError(f"store {store!r}: rank {rank} has a malformed sessions.rank_facts")
    groups = doc.get("group_ranks")
    group_ranks = {str(k): [int(r) for r in v] for k, v in groups.items()
                   if isinstance(v, list) and all(type(r) is int for r in v)} \
        if isinstance(groups, dict) else {}
    facts = RankFacts(rank, [path], _int_or_none(world_size),
                      str(doc.get("group", DEFAULT_GROUP)), group_ranks)
    for name in _INT_FACTS:
        setattr(facts, name, _int_or_none(doc.get(name)) or 0)
    facts.start_ns = _int_or_none(doc.get("start_ns"))
    facts.end_ns = _int_or_none(doc.get("end_ns"))
    return facts


def _calls(con, store: str) -> Dict[int, List[CollectiveCall]]:
    """Per rank, its calls in the order the store holds them (the scan keeps file order)."""
    out: Dict[int, List[CollectiveCall]] = {}
    rows = con.execute("SELECT rank, kind, bytes, arrival_ns, end_ns, duration_ns, call_site, "
                       "fr_pg, fr_seq, pg_desc, in_nelems, out_nelems, dtype "
                       "FROM collectives").fetchall()
    for rank, kind, nbytes, arrival, end, duration, site, pg, seq, *facts in rows:
        if None in (rank, kind, arrival, end, duration):
            raise StoreError(f"store {store!r}: rank {rank}: a collective without its kind "
                             f"or times")
        out.setdefault(int(rank), []).append(CollectiveCall(
            str(kind), nbytes, int(arrival), int(end), int(duration), site, pg, seq, *facts))
    return out


def store_rank_facts(con, store: str = "store") -> List[RankFacts]:
    """Per rank (ascending), its windows' facts added up and its collective calls.

    Raises StoreError when no window has rank facts (a store written without them).
    """
    rows = con.execute('SELECT rank, "window", source_path, window_name, world_size, '
                       'rank_facts FROM sessions ORDER BY rank, "window"').fetchall()
    by_rank: Dict[int, RankFacts] = {}
    for rank, _, path, name, world, text in rows:
        if text is None:
            continue
        facts = facts_of_window(int(rank), str(path or name or ""), world, text, store)
        if facts.rank in by_rank:
            by_rank[facts.rank].add(facts)
        else:
            by_rank[facts.rank] = facts
    if not by_rank:
        raise StoreError(f"store {store!r} has no rank facts (sessions.rank_facts is empty)")
    calls = _calls(con, store)
    for rank, facts in by_rank.items():
        facts.calls = sorted(calls.get(rank, []), key=lambda c: c.arrival_ns)
    return [by_rank[r] for r in sorted(by_rank)]


def load_store_job(store: str, con, visit: Optional[Callable] = None,
                   memory_limit: Optional[int] = None):
    """``analysis.ranks.job.load_job`` for a store: facts from SQL, each window's session in turn.

    ``visit(rank, path, session)`` sees every window's session while it is loaded; a
    window that would need more than ``memory_limit`` bytes is refused (StoreError).
    """
    from opscope.analysis.ranks.job import JobSteps
    from opscope.store.read import load_store_session
    from opscope.store.session_sql import store_windows

    facts = store_rank_facts(con, store)
    known = {f.rank for f in facts}
    steps = JobSteps(visit)
    for w in store_windows(con):
        if w.rank not in known:
            continue
        session = load_store_session(store, w.rank, w.window, memory_limit=memory_limit)
        steps(w.rank, w.source_path or w.name, session)
        del session  # one window in memory at a time (unless visit keeps it)
    return steps.job(facts)
