"""A 2-rank job whose opscope store threads are inside store calls when the main thread ends.

Each rank starts a thread with ``job_store.start_thread`` that calls the job's
store without pause until ``job_store.stopping()``, and, with ``--user-thread``,
a thread of the program's own that runs on for a while after the main thread
returns. The main thread returns at once. OUTDIR/polls.rank<R> gets how many
store calls the opscope thread made after the main thread finished, and whether
the program's thread was still running at its last one.

    torchrun --nproc-per-node 2 exit_job.py OUTDIR [--user-thread]
"""

import datetime
import os
import sys
import threading
import time

import torch.distributed as dist


def main():
    from opscope.collect.job import store as job_store

    outdir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    store = job_store.open_job_store()
    main_done = threading.Event()
    user_done = threading.Event()
    seen = {"after_main": 0, "user_running": False}

    def poll():
        while not job_store.stopping():
            store.has(job_store.key("exit", "probe"))
            if main_done.is_set():
                seen["after_main"] += 1
                seen["user_running"] = seen["user_running"] or not user_done.is_set()
        with open(os.path.join(outdir, f"polls.rank{rank}"), "w") as f:
            f.write(f"{seen['after_main']} {int(seen['user_running'])}")

    def user_work():
        time.sleep(1.0)
        user_done.set()

    job_store.start_thread(poll, "opscope-exit-probe")
    if "--user-thread" in sys.argv:
        threading.Thread(target=user_work, name="user-work").start()
    else:
        user_done.set()
    main_done.set()


if __name__ == "__main__":
    main()
