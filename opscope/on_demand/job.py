"""Whole-job on-demand requests: ``opscope trigger`` on one rank, every rank records.

On a multi-rank job a trigger request does not stay with the rank that got
it. That rank posts it in the job's own c10d store
(:mod:`opscope.collect.job.store`) with a first step far enough ahead for
every rank to see it: its current optimizer step plus :data:`MIN_MARGIN_STEPS`
plus the steps it runs in :data:`MARGIN_S`. Every rank's :class:`JobRequests`
thread (``job_store.start_thread``; it waits for the process group, then polls
the store every :data:`POLL_S`) arms its agent for exactly that step range, so every
rank records the same optimizer steps. A rank that sees the request after its
first step records nothing and says so. Each rank posts its answer; the
triggered rank gathers them (for at most :data:`GATHER_S` after its own) and
answers ``opscope trigger`` with every rank's trace.

Store keys (under ``opscope/on_demand/``): ``requests`` (a counter),
``request/<n>`` (the n-th request, JSON) and ``answer/<id>/<rank>`` (JSON).
Anyone who reaches the store may write them, so a request carries no path
(every rank writes into its own job folder, :func:`job_request.job_folder`),
it is parsed strictly and bounded (:mod:`opscope.on_demand.job_request`), and
what does not parse is skipped (one line on rank 0): junk in the counter, a
jump of it (only the newest :data:`BACKLOG` numbers are read), texts that are
not requests. Serving never stops.
Steps are counted by each rank's step tracker since on-demand profiling was
enabled, so ranks that enable it before training count alike.

Example::

    >>> margin_steps([(0.0, 10), (1.0, 30)])   # 20 steps a second, 2 s of margin
    42
"""

from __future__ import annotations

import collections
import json
import math
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from opscope.collect.job import store as job_store
from opscope.collect.job.store import JobStore, key
from opscope.on_demand import control
from opscope.on_demand.job_request import (MAX_AHEAD_STEPS, MAX_STEPS, job_folder, job_post,
                                           parse_answer, parse_job_request)
from opscope.step_tracker import StepTracker

POLL_S = 0.2
MARGIN_S = 2.0  # every rank sees a request within a few polls
MIN_MARGIN_STEPS = 2  # ranks of one job may be a step apart
GATHER_S = 30.0
MISSING_REQUEST_S = 10.0  # a counted request whose text never came is skipped after this
BACKLOG = 64  # the most request numbers read in one poll: after a jump, the newest
SEEN_IDS = 256  # request ids remembered, so a request read again is not served twice


def margin_steps(history: List[Tuple[float, int]]) -> int:
    """Steps between now and a job request's first step, from (time, step) observations."""
    rate = 0.0
    if len(history) >= 2 and history[-1][0] > history[0][0]:
        rate = (history[-1][1] - history[0][1]) / (history[-1][0] - history[0][0])
    margin = MIN_MARGIN_STEPS + int(math.ceil(max(rate, 0.0) * MARGIN_S))
    return min(margin, MAX_AHEAD_STEPS // 2)


class _Gathering:
    """The answers of every rank to a request this rank posted."""

    def __init__(self, request: Dict[str, Any], world_size: int):
        self.request = request
        self.world_size = world_size
        self.answers: Dict[int, Dict[str, Any]] = {}
        self.deadline: Optional[float] = None  # set once this rank's own answer is in


class JobRequests:
    """The store side of one process's on-demand agent (see the module docstring)."""

    def __init__(self, agent: Any):
        self.agent = agent
        self._outbox: Deque[Tuple[str, Any]] = collections.deque()
        self._gathering: Dict[str, _Gathering] = {}
        self._direct: Dict[str, bool] = {}  # ids also triggered here, posted by another rank
        self._history: Deque[Tuple[float, int]] = collections.deque(maxlen=50)
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._store: Optional[JobStore] = None
        self._opened: Optional[JobStore] = None  # opened on the training thread (open_store)
        self._next = 0
        self._missing: Dict[int, float] = {}  # counted request numbers without text: since
        self._seen: Deque[str] = collections.deque(maxlen=SEEN_IDS)
        self._thread = job_store.start_thread(self._run, "opscope-on-demand-job")

    @staticmethod
    def in_job() -> bool:
        """True while this process is a rank of a job of several ranks."""
        ranks = job_store.job_ranks()
        return ranks is not None and ranks[1] > 1

    @property
    def needs_store(self) -> bool:
        """True while no store connection is open and this process is a rank of a job."""
        return self._store is None and self._opened is None and self.in_job()

    def open_store(self) -> None:
        """Open this agent's store connection, on the calling (training) thread.

        Opening is a ``Store.clone()``, which connects with the job's own timeout; made
        here, it is never under way in the background thread when the interpreter exits
        (see :func:`job_store.start_thread`).
        Its later calls use :data:`job_store.STORE_TIMEOUT_S`, which exit waits out.
        """
        try:
            self._opened = job_store.open_job_store()
        except Exception as exc:  # noqa: BLE001  (never harm the job)
            job_store.warn_once(f"on-demand job requests: cannot open the job's store ({exc})")

    def post(self, request: Dict[str, Any]) -> None:
        """Post a trigger request to the whole job (from the signal handler)."""
        self._outbox.append(("request", request))

    def answer(self, request: Dict[str, Any], fields: Dict[str, Any]) -> None:
        """Post this rank's answer to a job request (kept at once on the triggered rank)."""
        gathering = self._gathering.get(request.get("id", ""))
        if gathering is not None and request.get("rank") == request.get("origin"):
            gathering.answers[request["rank"]] = fields
            return
        self._outbox.append(("answer", (request, fields)))
        if self._direct.pop(request.get("id", ""), False):  # this rank's trigger waits too
            try:
                control.write_result(self.agent.pid, request["id"], **fields)
            except (OSError, ValueError):
                pass

    def close(self, wait_s: float = 2.0) -> None:
        """Post what is waiting, answer the triggers with what was gathered, stop."""
        self._closing.set()
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001  (never harm the job; retry from scratch)
                job_store.warn_once(f"on-demand job requests: the job's store failed ({exc})")
                self._store = None
            if self._stop.is_set() or job_store.stopping():
                break
            self._stop.wait(POLL_S)
        self._finish_all()
        self._store = None  # its connection closes on this thread, not at finalisation

    def _tick(self) -> None:
        if not self.in_job():
            self._store = None
            self._serve_locally()
            return
        if self._store is None:
            self._store, self._opened = self._opened, None  # a failed store reopens next step
            if self._store is None:
                return
            self._next = (self._store.count(key("on_demand", "requests")) or 0) + 1
        self._history.append((time.monotonic(), StepTracker.current_step()))
        self._flush_outbox(self._store)
        self._read_requests(self._store)
        self._gather(self._store)

    def _serve_locally(self) -> None:
        """No job (any more): a waiting trigger request is served by this process alone."""
        while self._outbox:
            kind, item = self._outbox.popleft()
            if kind == "request":
                self.agent.arm(item)

    def _flush_outbox(self, store: JobStore) -> None:
        postponed = []
        while self._outbox:
            kind, item = self._outbox.popleft()
            if kind == "answer":
                request, fields = item
                store.set(key("on_demand", "answer", request["id"], store.rank),
                          json.dumps(fields))
            elif self._closing.is_set():
                self._refuse(item, "the process stopped serving requests before posting it")
            elif self._history[-1][0] - self._history[0][0] < 1.0:
                postponed.append((kind, item))  # a second of steps first, for the margin
            else:
                self._post_request(store, item)
        self._outbox.extend(postponed)

    def _refuse(self, request: Dict[str, Any], message: str) -> None:
        try:
            control.write_result(self.agent.pid, request["id"], status="error", message=message)
        except (OSError, ValueError):
            pass  # the trigger reports the missing answer when it times out

    def _post_request(self, store: JobStore, request: Dict[str, Any]) -> None:
        if int(request["steps"]) > MAX_STEPS:
            self._refuse(request, f"a job records at most {MAX_STEPS} steps; asked for "
                                  f"{request['steps']}")
            return
        # one trigger naming several ranks gives each the same id: the first posts it
        claim = key("on_demand", "claim", request["id"])
        if store.compare_set(claim, "", str(store.rank)) != str(store.rank):
            self._direct[request["id"]] = True
            return
        first = StepTracker.current_step() + margin_steps(list(self._history)) + 1
        posted = job_post(request, first, store.rank)
        n = store.increment(key("on_demand", "requests"))
        store.set(key("on_demand", "request", n), json.dumps(posted))
        self._gathering[posted["id"]] = _Gathering(posted, store.world_size)

    def _read_requests(self, store: JobStore) -> None:
        """Serve every request counted since the last poll; skip what does not parse."""
        count = store.count(key("on_demand", "requests"))
        if count is None:
            self._drop(store, "the request counter holds something else than a count")
            return
        if count < self._next - 1 or count - self._next >= BACKLOG:  # restarted, or a jump
            self._next = max(1, count - BACKLOG + 1)
        now = time.monotonic()
        for n in range(self._next, count + 1):
            self._missing.setdefault(n, now)
        self._next = count + 1
        for n, since in sorted(self._missing.items())[-BACKLOG:]:
            text = store.get(key("on_demand", "request", n))
            if text is not None:
                self._arm_from_store(text, store)
            if text is not None or now - since >= MISSING_REQUEST_S:
                del self._missing[n]  # served, or counted but never written: skipped
        for n in sorted(self._missing)[:-BACKLOG]:
            del self._missing[n]

    def _drop(self, store: JobStore, why: str) -> None:
        if store.rank == 0:
            job_store.warn_once(f"on-demand: dropped a job request from the job's store: {why}; "
                                f"the job goes on")

    def _arm_from_store(self, text: str, store: JobStore) -> None:
        request, why = parse_job_request(text, StepTracker.current_step(), store.world_size)
        if request is None:
            self._drop(store, why)
        elif request["id"] not in self._seen:
            self._seen.append(request["id"])
            self.agent.arm_job({**request, "rank": store.rank, "output_dir": job_folder()})

    # -- gathering the answers (on the triggered rank) -------------------------------------
    def _gather(self, store: JobStore) -> None:
        for request_id, gathering in list(self._gathering.items()):
            for rank in range(gathering.world_size):
                if rank not in gathering.answers:
                    name = key("on_demand", "answer", request_id, rank)
                    text = store.get(name)
                    if text is not None:
                        gathering.answers[rank] = parse_answer(text)
                        store.delete(name)
            own = gathering.answers.get(store.rank)
            if own is not None and gathering.deadline is None:
                gathering.deadline = time.monotonic() + GATHER_S
            late = gathering.deadline is not None and time.monotonic() > gathering.deadline
            if late or len(gathering.answers) == gathering.world_size:
                self._finish(request_id)

    def _finish(self, request_id: str) -> None:
        """Answer ``opscope trigger`` with every rank's answer gathered so far."""
        gathering = self._gathering.pop(request_id)
        own = gathering.answers.get(gathering.request["origin"]) or {
            "status": "error", "message": "this rank did not answer before it stopped"}
        job = {"folder": job_folder(), "world_size": gathering.world_size,
               "first_step": gathering.request["first_step"],
               "ranks": {str(r): a for r, a in sorted(gathering.answers.items())}}
        try:
            control.write_result(self.agent.pid, request_id, **{**own, "job": job})
        except (OSError, ValueError):
            pass  # the trigger reports the missing answer when it times out

    def _finish_all(self) -> None:
        for request_id in list(self._gathering):
            self._finish(request_id)

