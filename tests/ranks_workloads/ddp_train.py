"""A DDP job for tests/test_ranks.py, run by torchrun on gloo: one trace per rank.

Each rank profiles a few training steps of a small DDP model with opscope (or
torch.profiler) and writes OUTDIR/train.rank<R>.pt.trace.json, in a
``finally:`` so a failed job still leaves its traces. It counts the
collectives it issues (DDP's gradient allreduce through a comm hook, and an
explicit allreduce of the loss per step) in OUTDIR/counts.rank<R>.txt, and per
process group in OUTDIR/groups.rank<R>.txt (JSON).

    torchrun --nproc-per-node 2 ddp_train.py OUTDIR [--steps N] [--sleep-rank K --sleep-ms S]
        [--profiler opscope|torch] [--desync-rank R --desync-step N] [--timeout-s T]
        [--plain] [--second-group] [--small-rank R --small-step N] [--p2p]

``--plain`` records without record_shapes and with_stack; ``--second-group`` adds an
all_gather on a second process group each step; ``--small-rank`` makes that rank's
loss allreduce at step ``--small-step`` smaller than the other ranks' (2 elements, not 4);
``--p2p`` adds, each step, a ``send`` of 5 elements from rank 0 to rank 1 and an
``isend`` of 3 float64 elements back (``recv`` and ``irecv`` on the other side).
"""

import argparse
import collections
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from meet import meet_the_other_ranks  # beside this script

COUNT = [0]
PER_GROUP = collections.Counter()  # process group name -> collectives issued while profiled


def counting_hook(state, bucket):
    COUNT[0] += 1
    PER_GROUP[dist.distributed_c10d._get_process_group_name(dist.group.WORLD)] += 1
    return allreduce_hook(state, bucket)


def counted_all_reduce(tensor, group=None):
    COUNT[0] += 1
    PER_GROUP[dist.distributed_c10d._get_process_group_name(group or dist.group.WORLD)] += 1
    dist.all_reduce(tensor, group=group)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sleep-rank", type=int, default=-1)
    p.add_argument("--sleep-ms", type=float, default=0)
    p.add_argument("--profiler", default="opscope")
    p.add_argument("--desync-rank", type=int, default=-1)
    p.add_argument("--desync-step", type=int, default=-1)
    p.add_argument("--timeout-s", type=float, default=60)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--second-group", action="store_true")
    p.add_argument("--small-rank", type=int, default=-1)
    p.add_argument("--small-step", type=int, default=-1)
    p.add_argument("--p2p", action="store_true")
    return p.parse_args()


def make_profiler(kind, plain=False):
    if kind == "torch":
        return torch.profiler.profile(record_shapes=not plain, with_stack=not plain)
    import opscope
    return opscope.profile(record_shapes=not plain, with_stack=not plain)


def second_group_step(group, rank):
    """An all_gather on ``group`` (a group of its own, not the default one)."""
    COUNT[0] += 1
    PER_GROUP[dist.distributed_c10d._get_process_group_name(group)] += 1
    out = [torch.zeros(6) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, torch.full((6,), float(rank)), group=group)


def point_to_point(rank):
    """Rank 0 sends 5 elements to rank 1, which sends 3 back (others: nothing)."""
    if rank == 0:
        dist.send(torch.ones(5), 1)
        dist.irecv(torch.zeros(3, dtype=torch.float64), 1).wait()
    elif rank == 1:
        dist.recv(torch.zeros(5), 0)
        dist.isend(torch.ones(3, dtype=torch.float64), 0).wait()


def train_step(model, opt, x, rank, args, step):
    loss = model(x).sum()
    if rank == args.sleep_rank:
        time.sleep(args.sleep_ms / 1000)
    if rank == args.desync_rank and step == args.desync_step:
        dist.broadcast(torch.ones(3), src=0)  # the desync: only this rank issues it
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.p2p:
        point_to_point(rank)
    if args.second_group:
        second_group_step(args.group, rank)
        small = rank == args.small_rank and step == args.small_step
        counted_all_reduce(loss.detach().repeat(2 if small else 4))  # the smaller on one rank
    else:
        counted_all_reduce(loss.detach())


def main():
    args = parse()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # torchrun stops the others
    torch.set_num_threads(1)
    torch.manual_seed(0)
    meet_the_other_ranks("ddp_train/started")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    args.group = dist.new_group(list(range(dist.get_world_size()))) if args.second_group else None
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    model.register_comm_hook(None, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 32)
    for step in range(2):  # warm up: DDP rebuilds its buckets (broadcasts) here
        train_step(model, opt, x, rank, argparse.Namespace(**{**vars(args), "sleep_rank": -1,
                                                               "desync_rank": -1,
                                                               "small_rank": -1}), step)
    COUNT[0] = 0
    PER_GROUP.clear()
    prof = make_profiler(args.profiler, args.plain)
    path = os.path.join(args.outdir, f"train.rank{rank}.pt.trace.json")
    try:
        with prof:
            for step in range(args.steps):
                train_step(model, opt, x, rank, args, step)
                prof.step()
    finally:
        prof.export_chrome_trace(path)
        with open(os.path.join(args.outdir, f"counts.rank{rank}.txt"), "w") as f:
            f.write(str(COUNT[0]))
        with open(os.path.join(args.outdir, f"groups.rank{rank}.txt"), "w") as f:
            json.dump(PER_GROUP, f)
    # gloo's workers take the GIL to drop the last collective's tensors: give it to them
    # before the group goes or Python exits, or torch may abort or hang (pytorch #190489)
    time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
