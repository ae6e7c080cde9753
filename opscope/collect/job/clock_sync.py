"""This rank's clock offset to rank 0, estimated through the job's c10d store.

Ranks on one host share a clock. Across hosts they do not, so when a
recording starts on a multi-rank job :class:`ClockSync` estimates, in a
background thread, the nanoseconds to ADD to this rank's Unix times
to get rank 0's clock (the trace metadata's ``opscopeClockOffsetNs``):

- every rank publishes its host name under ``opscope/clock/host/<rank>``;
- rank 0 answers pings: it watches the counter ``opscope/clock/pings`` and
  answers each new ping ``n`` with its Unix ns under ``opscope/clock/pong/<n>``;
- a rank on another host than rank 0 (or any rank, with
  ``OPSCOPE_CLOCK_SYNC=1``) sends :data:`SAMPLES` pings and keeps the one
  with the shortest round trip: offset = t_rank0 - (t_send + t_recv) / 2.

Rank 0 writes 0 when some rank is on another host (or with the variable
set). Whoever reaches the store could plant answers, so an estimate is kept
only when it is what the ranks measured (:func:`checked_offset`): every
answer a time, rank 0's times consistent with every round trip (the true
offset lies within each one's bounds, so the bounds must overlap), and at
most :data:`MAX_OFFSET_NS` (a minute). Anything else is refused, and the
trace says why in one warning line. Where torchrun's ``LOCAL_WORLD_SIZE`` equals the world size every rank
is on one host and nothing is exchanged. A rank whose rank 0 does not
answer writes nothing and warns in one line. ``OPSCOPE_CLOCK_SYNC=0`` turns
it off. Starting costs a thread; ``offset()`` at stop waits at most
:data:`STOP_WAIT_S` for the estimate.

Example::

    >>> estimate_offset([(100, 1000, 140), (200, 1060, 210)])  # the 10 ns round trip wins
    855
    >>> checked_offset([(100, 1000, 140), (200, 1100, 210)])  # consistent: both bound 895
    (895, '')
    >>> ClockSync.start() is None   # no process group here: nothing to do
    True
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from typing import List, Optional, Sequence, Tuple

from opscope.collect.job import store as job_store
from opscope.collect.job.store import JobStore, key

CLOCK_SYNC_ENV = "OPSCOPE_CLOCK_SYNC"
SAMPLES = 8
HOST_WAIT_S = 5.0  # for rank 0's host name: rank 0 publishes it when it starts recording
ANSWER_WAIT_S = 5.0  # for rank 0's first answer
SAMPLE_WAIT_S = 1.0  # for each later answer
STOP_WAIT_S = 2.0  # the most offset() waits for an unfinished estimate
ANSWER_AFTER_STOP_S = 3.0  # rank 0 answers this long after its own stop, for later ranks
IDLE_POLL_S = 0.02  # rank 0, between pings
BUSY_POLL_S = 0.0005  # rank 0 just after a ping; a rank waiting for its answer
BUSY_FOR_S = 1.0

MAX_OFFSET_NS = 60 * 10**9  # clocks of one job a minute apart: not a measurement
SLACK_NS = 1000  # rounding and clock slew between the bounds of two round trips
_UNIX_NS = re.compile(r"[0-9]{1,19}")

Sample = Tuple[int, int, int]  # (t_send, t_rank0, t_recv), Unix ns


def clock_sync_mode() -> str:
    """``"on"`` (``OPSCOPE_CLOCK_SYNC=1``), ``"off"`` (``=0``) or ``"auto"`` (by host).

    >>> os.environ.pop(CLOCK_SYNC_ENV, None) and None; clock_sync_mode()
    'auto'
    """
    value = os.environ.get(CLOCK_SYNC_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return "on"
    if value in ("0", "false", "no", "off"):
        return "off"
    return "auto"


def estimate_offset(samples: Sequence[Sample]) -> Optional[int]:
    """The offset of the sample with the shortest round trip; None without samples."""
    if not samples:
        return None
    send, rank0, recv = min(samples, key=lambda s: s[2] - s[0])
    return rank0 - (send + recv) // 2


def checked_offset(samples: Sequence[Sample]) -> Tuple[Optional[int], str]:
    """``(offset, '')`` when ``samples`` are a measurement; ``(None, why)`` otherwise.

    Each sample bounds the offset to ``[t_rank0 - t_recv, t_rank0 - t_send]``;
    answers planted in the store, not given by rank 0 while this rank waited,
    give bounds that do not overlap (or an offset over a minute).
    """
    offset = estimate_offset(samples)
    if offset is None:
        return None, ""
    low = max(rank0 - recv for _, rank0, recv in samples)
    high = min(rank0 - send for send, rank0, _ in samples)
    if len(samples) < 2 or low > high + SLACK_NS:
        return None, (f"rank 0's {len(samples)} answers do not fit the round trips "
                      f"measured (refused: answers in the job's store that rank 0 did not give?)")
    if abs(offset) > MAX_OFFSET_NS:
        return None, (f"the measured offset {offset / 1e9:.3g} s is over "
                      f"{MAX_OFFSET_NS // 10**9} s (refused)")
    return offset, ""


def launched_on_one_host(world_size: int) -> bool:
    """True when torchrun says every rank runs on this host (``LOCAL_WORLD_SIZE``).

    >>> launched_on_one_host(4), os.environ.get("LOCAL_WORLD_SIZE") is None
    (False, True)
    """
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return local.isdigit() and int(local) == world_size


class ClockSync:
    """One recording's estimate of this rank's offset to rank 0.

    ``ClockSync.start()`` returns None when there is nothing to estimate (no
    multi-rank job, or ``OPSCOPE_CLOCK_SYNC=0``); else a running estimate.
    ``offset()`` ends it and returns the value to write, or None (with
    ``problem`` saying why, when it is worth a warning).
    """

    def __init__(self, mode: str, rank: int):
        self.mode = mode
        self.rank = rank
        self.problem = ""
        self._result: Optional[int] = None
        self._done = threading.Event()
        self._stop = threading.Event()
        self._answer_until = float("inf")  # rank 0: monotonic time it stops answering
        self._thread: Optional[threading.Thread] = None
        self._store: Optional[JobStore] = None

    @classmethod
    def start(cls) -> Optional["ClockSync"]:
        """Begin estimating in a background thread; None when there is nothing to estimate."""
        mode = clock_sync_mode()
        ranks = job_store.job_ranks()
        if mode == "off" or ranks is None or ranks[1] <= 1:
            return None
        if mode == "auto" and launched_on_one_host(ranks[1]):
            return None
        # opened here, not in the thread: the clone connects with the job's own timeout,
        # and a thread still in a store call at interpreter exit aborts the process
        store = job_store.open_job_store()
        if store is None:
            return None
        sync = cls(mode, ranks[0])
        sync._store = store
        sync._thread = job_store.start_thread(sync._run, "opscope-clock-sync")
        return sync

    def offset(self, wait_s: float = STOP_WAIT_S) -> Optional[int]:
        """Stop; the offset to write (rank 0: 0 when any rank syncs), else None.

        Rank 0 returns at once and goes on answering for
        :data:`ANSWER_AFTER_STOP_S`, for ranks whose recording stops later.
        """
        if self.rank == 0:
            self._answer_until = time.monotonic() + ANSWER_AFTER_STOP_S
            return self._result
        self._done.wait(wait_s)
        self._stop.set()
        if not self._done.is_set():
            self.problem = (f"rank 0 did not answer within {wait_s:g} s of the recording's "
                            f"stop")
            return None
        return self._result

    def cancel(self) -> None:
        """End the estimate, keeping nothing."""
        self._stop.set()

    def _stopped(self) -> bool:
        return self._stop.is_set() or job_store.stopping()

    def _run(self) -> None:
        store, self._store = self._store, None  # its connection closes on this thread
        try:
            if store is None:
                return
            store.set(key("clock", "host", self.rank), socket.gethostname())
            if self.rank == 0:
                self._answer_pings(store)
            else:
                self._result = self._measure(store)
        except Exception as exc:  # noqa: BLE001  (never harm the job: no offset, one line)
            self.problem = f"the clock offset to rank 0 failed ({exc})"
        finally:
            self._done.set()

    # -- rank 0 ---------------------------------------------------------------------------
    def _answer_pings(self, store: JobStore) -> None:
        """Answer every ping until stopped; note whether any rank syncs."""
        answered = _Answered.value
        busy_until = 0.0
        while not self._stopped() and time.monotonic() < self._answer_until:
            count = store.count(key("clock", "pings"))
            if count is not None and count > answered:
                now = time.time_ns()
                for n in range(max(answered + 1, count - 1024), count + 1):
                    store.set(key("clock", "pong", n), str(now))
                answered = _Answered.value = count
                busy_until = time.monotonic() + BUSY_FOR_S
            if self._result is None and (self.mode == "on"
                                         or (store.count(key("clock", "remote")) or 0) > 0):
                self._result = 0
            self._stop.wait(BUSY_POLL_S if time.monotonic() < busy_until else IDLE_POLL_S)

    # -- other ranks ----------------------------------------------------------------------
    def _measure(self, store: JobStore) -> Optional[int]:
        if self.mode == "auto":
            rank0_host = self._wait_for(store, key("clock", "host", 0), HOST_WAIT_S, IDLE_POLL_S)
            if rank0_host is None:
                self.problem = f"rank 0 did not publish its host within {HOST_WAIT_S:g} s"
                return None
            if rank0_host == socket.gethostname():
                return None  # one host, one clock
            store.increment(key("clock", "remote"))
        samples: List[Sample] = []
        for i in range(SAMPLES):
            sample = self._ping(store, ANSWER_WAIT_S if i == 0 else SAMPLE_WAIT_S)
            if sample is None or sample[1] < 0:
                break
            samples.append(sample)
        if sample is not None and sample[1] < 0:
            self.problem = "an answer in the job's store is not a time (refused)"
            return None
        if not samples and not self._stopped():
            self.problem = f"rank 0 did not answer within {ANSWER_WAIT_S:g} s"
        offset, why = checked_offset(samples)
        self.problem = why or self.problem
        return offset

    def _ping(self, store: JobStore, wait_s: float) -> Optional[Sample]:
        send = time.time_ns()
        n = store.increment(key("clock", "pings"))
        pong = key("clock", "pong", n)
        deadline = time.monotonic() + wait_s
        while not store.has(pong):
            if self._stopped() or time.monotonic() >= deadline:
                return None
            time.sleep(BUSY_POLL_S)
        recv = time.time_ns()
        answer = store.get(pong)
        store.delete(pong)
        if answer is None:
            return None
        return (send, int(answer) if _UNIX_NS.fullmatch(answer) else -1, recv)

    def _wait_for(self, store: JobStore, name: str, wait_s: float,
                  poll_s: float) -> Optional[str]:
        deadline = time.monotonic() + wait_s
        while not self._stopped():
            value = store.get(name)
            if value is not None or time.monotonic() >= deadline:
                return value
            time.sleep(poll_s)
        return None


class _Answered:
    """The last ping rank 0 answered, kept across recordings of this process."""

    value = 0


def _reset_in_child() -> None:
    _Answered.value = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
