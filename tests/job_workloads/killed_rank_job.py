"""A DDP job for tests/test_job_signals.py, run as ``torchrun ... -m opscope.on_demand``.

Each rank trains step after step (a short sleep in each), writes its pid to
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
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    deadline = time.monotonic() + 150
    step = 0
    while time.monotonic() < deadline:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if step == 5:
            with open(os.path.join(outdir, f"pid.rank{rank}"), "w") as f:
                f.write(str(os.getpid()))
        if recording():
            open(os.path.join(outdir, f"recording.rank{rank}"), "a").close()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
