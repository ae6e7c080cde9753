"""A job for tests/test_hang.py: rank 1 skips one all_reduce, and the job hangs.

Run as ``torchrun --nproc-per-node 2 -m opscope run -o OUT --hang-after S hang_job.py
FLAGS [options]``. Each rank trains a small model (no DDP, so the only collective
is one all_reduce a step: step k's is number k+1 of the default group). At
``--slow-step`` rank 1 sleeps ``--slow-s`` seconds before its all_reduce (a wait
shorter than ``--hang-after``, which must not be reported). At ``--skip-step``
rank 1 skips the all_reduce, writes FLAGS/skipped and waits in Python at the
line marked ``WAITS HERE`` until torchrun stops it; rank 0 waits inside the
all_reduce until the process group's timeout (``--timeout-s``).
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("flags")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--slow-step", type=int, default=-1)
    p.add_argument("--slow-s", type=float, default=0.0)
    p.add_argument("--skip-step", type=int, default=-1)
    p.add_argument("--timeout-s", type=float, default=40)
    return p.parse_args()


def wait_for_torchrun():
    for _ in range(2400):
        time.sleep(0.05)  # WAITS HERE (short sleeps: torchrun's SIGTERM is handled between)


def main():
    args = parse()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        loss = model(torch.ones(4, 8)).sum()
        total = loss.detach().clone()
        if rank == 1 and step == args.slow_step:
            time.sleep(args.slow_s)
        if rank == 1 and step == args.skip_step:
            open(os.path.join(args.flags, "skipped"), "w").close()
            wait_for_torchrun()
        dist.all_reduce(total)
        loss.backward()
        opt.step()
        opt.zero_grad()
    time.sleep(0.1)  # gloo's last-collective race at exit (pytorch #190489)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
