"""A DDP job that ends well, then lists its threads: does its process group outlive it?

Each rank trains a small DDP model for two steps on gloo, allreduces a token,
calls ``destroy_process_group()`` and writes the names of its threads
(/proc/self/task/*/comm) to OUTDIR/threads.rank<R>.json. A group that is
really destroyed leaves no ``gloo_tcp_loop`` thread behind.

    opscope run --nproc-per-node 2 group_exit.py OUTDIR
    torchrun --nproc-per-node 2 group_exit.py OUTDIR
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist


def thread_names():
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


def main(outdir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    token = torch.ones(1)
    dist.all_reduce(token)
    del model, opt
    dist.destroy_process_group()
    with open(os.path.join(outdir, f"threads.rank{rank}.json"), "w") as f:
        json.dump(thread_names(), f)


if __name__ == "__main__":
    main(sys.argv[1])
