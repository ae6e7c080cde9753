"""Wait until every rank of a torchrun job has started, before its process group is made.

The test jobs make their group with a short timeout (their hangs and desyncs end on it),
and ``init_process_group`` waits for the other ranks within that same timeout: on a
loaded machine one rank may start seconds after the other, and the job would fail at its
start instead of where the test means it to. ``meet_the_other_ranks(key)`` waits on
torchrun's own store (``MASTER_ADDR``/``MASTER_PORT``), with a patience of its own.
It covers a late start only: gloo's own connecting inside ``init_process_group`` still
runs within the group's timeout (p2p_job.py therefore makes its group with a minute's
timeout and runs its desync on a short group of its own).
"""

from __future__ import annotations

import datetime
import os
import time

import torch.distributed as dist


def meet_the_other_ranks(key: str, patience_s: float = 120.0) -> None:
    """Count this rank in at ``key`` and wait until every rank has (or ``patience_s``)."""
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=datetime.timedelta(seconds=patience_s))
    store.add(key, 1)
    deadline = time.monotonic() + patience_s
    while store.add(key, 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)
