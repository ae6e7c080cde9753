"""A DDP job for tests/test_on_demand_job.py, run as ``torchrun ... -m opscope.on_demand``.

Each rank trains a small DDP model step after step (a short sleep in each) and,
after a few steps, writes its pid to OUTDIR/pid.rank<R>. The ranks stop together,
at the first step after OUTDIR/stop appears on any of them (an allreduce of the
flag), or after a deadline.

    torchrun --nproc-per-node 2 -m opscope.on_demand on_demand_job.py OUTDIR
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


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
    while True:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if step == 5:
            with open(os.path.join(outdir, f"pid.rank{rank}"), "w") as f:
                f.write(str(os.getpid()))
        stop = torch.tensor([float(os.path.exists(os.path.join(outdir, "stop"))
                                   or time.monotonic() > deadline)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
        time.sleep(0.02)
    # gloo's workers take the GIL to drop the last collective's tensors: give it to them
    # before the group goes or Python exits, or torch may abort or hang (pytorch #190489)
    time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
