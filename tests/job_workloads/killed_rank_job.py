"""A DDP job for tests/test_job_signals.py, run as ``torchrun ... -m opscope.on_demand``.

Each rank trains step after step (an allreduce in each) (a short sleep in each), writes its pid to
OUTDIR/pid.rank<R> after a few steps, and OUTDIR/recording.rank<R> once an
on-demand window has recorded a step. It trains until killed (or a deadline):
the test kills one rank in the middle of a job-wide window.

    torchrun --nproc-per-node 2 -m opscope.on_demand killed_rank_job.py OUTDIR
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def recording() -> bool:
    agent = getattr(sys.modules.get("opscope.on_demand"), "_agent", None)
    window = getattr(agent, "_window", None)
    return window is not None and window.remaining < window.request["steps"]


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, layer = dist.get_rank(), torch.nn.Linear(8, 8)
    sgd = torch.optim.SGD(layer.parameters(), lr=0.01)
    stop_at = time.monotonic() + 150
    for step in range(1, 10 ** 9):
        loss = layer(torch.ones(2, 8)).sum()
        loss.backward()
        dist.all_reduce(loss.detach())  # a collective each step: a dead rank breaks it
        sgd.step()
        sgd.zero_grad()
        if step == 5:
            with open(os.path.join(outdir, f"pid.rank{rank}"), "w") as f:
                f.write(str(os.getpid()))
        if recording():
            open(os.path.join(outdir, f"recording.rank{rank}"), "a").close()
        if time.monotonic() > stop_at:
            break
        time.sleep(0.02)

if __name__ == "__main__":
    main()
