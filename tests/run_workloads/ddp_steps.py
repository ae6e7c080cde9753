"""A DDP training script for tests/test_run_distributed.py, run by torchrun under ``opscope run``.

Each rank trains a small DDP model on gloo for ``--steps`` optimizer steps and
writes COUNTS_DIR/counts.rank<R>.txt: a JSON list of the collectives it issued
in each step (the loss allreduce and DDP's gradient allreduce, through a comm
hook), so a test knows how many a recorded window holds. Every collective of
a step comes before its ``optimizer.step()``, so it falls in that step's
``ProfilerStep#N``. With ``--fail-rank R --fail-step S``, rank R raises at the
start of step S while every other rank waits in Python (as a long compute
would) until torchrun stops it. With ``--extra-rank R --extra-step S``, rank R
issues a broadcast no other rank issues at step S, and every rank hangs until
the process group's timeout (``--timeout-s``).

    ddp_steps.py COUNTS_DIR [--steps N] [--fail-rank R --fail-step S]
        [--extra-rank R --extra-step S] [--timeout-s T]
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

COUNTS = []


def counting_hook(state, bucket):
    COUNTS[-1] += 1
    return allreduce_hook(state, bucket)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("counts_dir")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--extra-rank", type=int, default=-1)
    p.add_argument("--extra-step", type=int, default=-1)
    p.add_argument("--timeout-s", type=float, default=120)
    return p.parse_args()


def wait_for_torchrun():
    for _ in range(1200):  # short sleeps: the SIGTERM handler runs between them
        time.sleep(0.1)


def train(args, rank):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    model.register_comm_hook(None, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    for step in range(args.steps):
        if step == args.fail_step:
            if rank == args.fail_rank:
                time.sleep(1)  # the others are waiting by now, not in a collective
                raise RuntimeError(f"rank {rank} fails at step {step}")
            wait_for_torchrun()
        COUNTS.append(0)
        if step == args.extra_step and rank == args.extra_rank:
            dist.broadcast(torch.ones(3), src=0)  # the desync: only this rank issues it
            COUNTS[-1] += 1
        loss = model(x).sum()
        total = loss.detach().clone()
        dist.all_reduce(total)
        COUNTS[-1] += 1
        loss.backward()
        opt.step()
        opt.zero_grad()


def main():
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    try:
        train(args, rank)
    finally:
        with open(os.path.join(args.counts_dir, f"counts.rank{rank}.txt"), "w") as f:
            json.dump(COUNTS, f)
    # gloo's workers take the GIL to drop the last collective's tensors: give it to them
    # before the group goes or Python exits, or torch may abort or hang (pytorch #190489)
    time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
