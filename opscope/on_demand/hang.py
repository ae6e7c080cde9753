"""A live hang, named in seconds: a collective some ranks entered and others have not.

Under ``opscope run`` in a torch.distributed job every rank starts a
:class:`HangWatch` (``--hang-after S``, default 10; 0 turns it off). Its
thread (``job_store.start_thread``; it waits for the process group and ends
with the program) polls every :data:`POLL_S`:

1. Locally, without the store: torch's flight recorder's per-group pair (last
   collective enqueued, last completed; ``live_collectives.pending_groups``).
   A pair that stays unequal for ``S`` seconds means this rank has been inside
   one collective that long: it raises the counter ``opscope/hang/ask``, once
   per such collective.
2. One store call: the ask counter. When it went up, the rank publishes its
   state once (``live_collectives.rank_state``: groups, last numbers entered,
   collectives not retired, main thread's stack) under
   ``opscope/hang/state/<ask>/<rank>``.
3. Rank 0 gathers the states of an ask (at most :data:`GATHER_S`: a dead rank
   never answers and is named as not answering) and runs
   ``analysis.ranks.hangs.find_hang``. A hang is written to ``DIR/hang.json``
   (atomically), named in one stderr line, and posted as ``opscope/hang/found``.
4. Every rank that sees ``found`` (read each poll after an ask) calls ``on_hang``
   once: ``opscope run`` writes what it recorded so far, marked partial.

So a collective that completes costs nothing of opscope's (the recorder is
torch's, and no store call is made per collective); each rank makes one store
call per poll (two once it answered an ask; rank 0 reads every rank's state
while it gathers one). Anything read from the store is parsed strictly; junk is
skipped (one line on rank 0), never raised, and the thread never raises into
the job: an error drops the store connection and the next poll reopens it.
The job is left alone: opscope neither kills nor unblocks it. One hang is
reported per run; the thread then ends.

Example::

    >>> watch = HangWatch("/tmp", "out", hang_after_s=10)
    >>> watch.tick(now=0.0)   # no process group in this process: nothing to watch
    >>> watch.reported
    False
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

from opscope.analysis.ranks.hangs import find_hang, hang_line, parse_state
from opscope.load.ranks import HANG_FILE
from opscope.collect.job import store as job_store, live_collectives
from opscope.collect.job.store import JobStore, key

POLL_S = 0.5
GATHER_S = 5.0  # rank 0 waits this long for every rank's state after an ask
DEFAULT_HANG_AFTER_S = 10.0
HANG_KEY = "opscopeHang"  # the trace metadata of a window written at a hang


class LiveSource:
    """What a HangWatch reads of its own process (tests give it another)."""

    @staticmethod
    def ranks() -> Optional[Tuple[int, int]]:
        """(rank, world size) of the job; None while there is no job of several ranks."""
        ranks = job_store.job_ranks()
        return ranks if ranks is not None and ranks[1] > 1 else None

    @staticmethod
    def open_store() -> Optional[JobStore]:
        """A store connection of this thread's own."""
        return job_store.open_job_store()

    pending = staticmethod(live_collectives.pending_groups)
    state = staticmethod(live_collectives.rank_state)


class _Question:
    """An ask rank 0 is gathering states for."""

    def __init__(self, number: int, deadline: float):
        self.number = number
        self.deadline = deadline
        self.states: Dict[int, Dict[str, Any]] = {}


class HangWatch:
    """One rank's side of the hang detector (see the module docstring)."""

    def __init__(self, folder: str, shown_folder: str, hang_after_s: float,
                 on_hang: Optional[Callable[[], None]] = None, source: Any = None):
        self.folder = folder
        self.shown_folder = shown_folder
        self.hang_after_s = float(hang_after_s)
        self.on_hang = on_hang
        self.source = LiveSource() if source is None else source
        self.reported = False  # this rank handled a reported hang
        self._store: Optional[JobStore] = None
        self._stuck: Dict[str, Tuple[Tuple[int, int], float]] = {}  # group id: (pair, since)
        self._asked: Set[Tuple[str, Tuple[int, int]]] = set()
        self._answered = 0  # the last ask this rank published its state for
        self._question: Optional[_Question] = None
        self._analysed = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> "HangWatch":
        """A HangWatch with its thread running."""
        watch = cls(*args, **kwargs)
        watch._thread = job_store.start_thread(watch._run, "opscope-hang-watch")
        return watch

    def close(self, wait_s: float = job_store.EXIT_WAIT_S) -> None:
        """Stop the thread (it ends within a poll, or a store call's timeout)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(wait_s)

    def _run(self) -> None:
        while not (self._stop.is_set() or job_store.stopping() or self.reported):
            try:
                self.tick(time.monotonic())
            except Exception as exc:  # noqa: BLE001  (never into the job; reopen next poll)
                job_store.warn_once(f"hang detection: the job's store failed ({exc}); "
                                    f"retrying")
                self._store = None
            self._stop.wait(POLL_S)
        self._store = None  # its connection closes on this thread, not at finalisation

    # -- one poll -------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """One poll: watch this rank, answer an ask, gather (rank 0), act on a found hang."""
        if self.reported:
            return
        if self._store is None:
            if self.source.ranks() is None:
                return
            self._store = self.source.open_store()
            if self._store is None:
                return
        store = self._store
        self._watch_here(store, now)
        asked = store.count(key("hang", "ask"))
        if asked is None:
            if store.rank == 0:
                job_store.warn_once("hang detection: skipped a value in the job's store that "
                                    "is not a count (opscope/hang/ask); the job goes on")
            return
        if asked < self._answered:  # the counter was reset: start again from it
            self._answered = self._analysed = asked
        if asked > self._answered:
            state = self.source.state(store.rank)
            if state is not None:
                store.set(key("hang", "state", asked, store.rank), json.dumps(state))
            self._answered = asked
        if store.rank == 0:
            self._gather(store, asked, now)
        elif self._answered > 0:
            found = job_store.parse_count(store.get(key("hang", "found")))
            if found is not None and 0 < found <= self._answered:
                self._handle()

    def _watch_here(self, store: JobStore, now: float) -> None:
        """Ask the job once for each collective this rank has been inside ``hang_after_s``."""
        pending = self.source.pending()
        if pending is None:
            if store.rank == 0 and self.source.ranks() is not None:
                job_store.warn_once("hang detection is off: torch's flight recorder cannot be "
                                    "read in this torch")
            return
        stuck = {}
        for group, pair in pending.items():
            if pair[0] <= pair[1]:
                continue
            previous = self._stuck.get(group)
            stuck[group] = previous if previous is not None and previous[0] == pair else (pair, now)
            if now - stuck[group][1] >= self.hang_after_s and (group, pair) not in self._asked:
                self._asked.add((group, pair))
                store.increment(key("hang", "ask"))
        self._stuck = stuck
        self._asked &= {(group, entry[0]) for group, entry in stuck.items()}

    def _gather(self, store: JobStore, asked: int, now: float) -> None:
        if asked > self._analysed and (self._question is None
                                       or self._question.number != asked):
            self._question = _Question(asked, now + GATHER_S)
        question = self._question
        if question is None:
            return
        for rank in range(store.world_size):
            if rank not in question.states:
                name = key("hang", "state", question.number, rank)
                state = parse_state(store.get(name), rank, store.world_size)
                if state is not None:
                    question.states[rank] = state
        if len(question.states) < store.world_size and now < question.deadline:
            return
        self._question, self._analysed = None, question.number
        for rank in question.states:
            store.delete(key("hang", "state", question.number, rank))
        hang = find_hang(question.states, world_size=store.world_size,
                         hang_after_s=self.hang_after_s, now_ns=time.time_ns())
        if hang is not None:
            self._report(store, question.number, hang)

    def _report(self, store: JobStore, number: int, hang: Dict[str, Any]) -> None:
        """Rank 0: hang.json, the stderr line, ``found`` for every rank; then write here."""
        doc = {"hang_after_s": self.hang_after_s, "detected_unix_ns": time.time_ns(),
               "world_size": store.world_size, **hang}
        shown = os.path.join(self.shown_folder, HANG_FILE)
        try:
            from opscope.files import output_file

            with output_file(os.path.join(self.folder, HANG_FILE)).open() as f:
                json.dump(doc, f, indent=1)
        except OSError as exc:
            shown = f"(cannot write {shown}: {exc.strerror or exc})"
        print(hang_line(hang, shown), file=sys.stderr, flush=True)
        store.set(key("hang", "found"), str(number))
        self._handle()

    def _handle(self) -> None:
        """This rank's part of a reported hang: ``on_hang``, once; it never raises."""
        self.reported = True
        if self.on_hang is None:
            return
        try:
            self.on_hang()
        except Exception as exc:  # noqa: BLE001  (never into the job)
            job_store.warn_once(f"hang detection: cannot write what was recorded: {exc}")
