"""One rank's black box dump brings every rank's: through the job's c10d store.

On a job of several ranks (``torch.distributed`` initialised), a dump on
one rank is posted in the job's own store (:mod:`opscope.collect.job.store`:
no port, no transport of opscope's own): the counter ``opscope/blackbox/dumps``
is raised and ``opscope/blackbox/dump/<n>`` holds ``{"origin", "reason",
"unix_ns"}``. Every rank's :class:`JobDumps` thread polls the counter every
:data:`POLL_S` and dumps its own ring for a post of another rank, with the
origin in its facts, so the dumps of all ranks cover the same moment.
Anyone who reaches the store may write these keys: a post is parsed
strictly and bounded (:func:`parse_post`), what does not parse is skipped,
and at most :data:`BACKLOG` numbers are read in one poll.

Example::

    >>> parse_post('{"origin": 1, "reason": "slow_step", "unix_ns": 5}', world_size=2)
    {'origin': 1, 'reason': 'slow_step', 'unix_ns': 5}
    >>> parse_post('{"origin": 7, "reason": "slow_step", "unix_ns": 5}', world_size=2) is None
    True
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Dict, Optional

from opscope.black_box.dump import REASONS
from opscope.collect.job import store as job_store
from opscope.collect.job.store import JobStore, key

POLL_S = 0.5
BACKLOG = 16
MAX_POST_CHARS = 256
MISSING_POST_S = 5.0  # a counted post whose text never came is skipped after this
COUNTER = key("blackbox", "dumps")


def parse_post(text: Optional[str], world_size: int) -> Optional[Dict[str, Any]]:
    """A dump post, checked: its origin a rank of the job, a known reason, a time."""
    if not isinstance(text, str) or len(text) > MAX_POST_CHARS:
        return None
    try:
        post = json.loads(text)
    except ValueError:
        return None
    if not isinstance(post, dict) or set(post) != {"origin", "reason", "unix_ns"}:
        return None
    origin, reason, unix_ns = post["origin"], post["reason"], post["unix_ns"]
    if (not _is_int(origin) or not 0 <= origin < world_size or reason not in REASONS
            or not _is_int(unix_ns) or not 0 <= unix_ns < 2 ** 63):
        return None
    return post


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def post_dump(reason: str) -> Optional[int]:
    """Ask every rank to dump (from the dumping thread: a store call answers at once, or
    within the store's timeout); the post's number, or None outside a multi-rank job."""
    store = job_store.open_job_store()
    if store is None:
        return None
    number = store.increment(COUNTER)
    store.set(key("blackbox", "dump", number), json.dumps(
        {"origin": store.rank, "reason": reason, "unix_ns": time.time_ns()}))
    return number


class JobDumps:
    """The thread that dumps this rank's ring when another rank posts a dump."""

    def __init__(self, dump: Callable[[str, Dict[str, Any]], None]):
        self._dump = dump
        self._since_ns = time.time_ns()  # posts older than this black box are not its
        self._stop = threading.Event()
        self._missing: Dict[int, float] = {}  # post number -> when it was first missing

    def start(self) -> None:
        job_store.start_thread(self._run, "opscope-blackbox-job")

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        store: Optional[JobStore] = None
        seen = 0
        while not self._stop.wait(POLL_S) and not job_store.stopping():
            try:
                if store is None:
                    ranks = job_store.job_ranks()
                    if ranks is None or ranks[1] <= 1:
                        continue
                    store = job_store.open_job_store()
                    if store is None:
                        return
                    seen = max(0, (store.count(COUNTER) or 0) - BACKLOG)  # then by their time
                    continue
                seen = self._serve(store, seen)
            except Exception as exc:  # noqa: BLE001 - never harm the job: one line, stop
                job_store.warn_once(f"the black box no longer hears other ranks' dumps: "
                                    f"{' '.join(str(exc).split())[:200]}")
                return

    def _serve(self, store: JobStore, seen: int) -> int:
        count = store.count(COUNTER)
        if count is None or count < seen:  # junk, or a restarted counter: start again
            return count or 0
        for number in range(max(seen + 1, count - BACKLOG + 1), count + 1):
            text = store.get(key("blackbox", "dump", number))
            if text is None and time.monotonic() - self._missing.setdefault(
                    number, time.monotonic()) < MISSING_POST_S:
                return number - 1  # counted, not written yet: read it again next time
            self._missing.pop(number, None)
            post = parse_post(text, store.world_size)
            if (post is not None and post["origin"] != store.rank
                    and post["unix_ns"] >= self._since_ns):
                self._dump(post["reason"], {"job_dump": number, "origin_rank": post["origin"],
                                            "origin_unix_ns": post["unix_ns"]})
        return count
