"""A DDP job for tests/test_clock_sync.py, run by torchrun on gloo: one trace per rank.

Each rank profiles a few training steps with opscope and writes
OUTDIR/train.rank<R>.pt.trace.json, then trains one more step and allreduces a
token (the job goes on after the recording) and writes OUTDIR/done.rank<R>.txt.
``--rank0-silent`` turns clock sync off on rank 0 (OPSCOPE_CLOCK_SYNC=0 there), so
rank 0 never answers the other ranks' pings.

    torchrun --nproc-per-node 2 clock_job.py OUTDIR [--steps N] [--rank0-silent]
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rank0-silent", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if args.rank0_silent and rank == 0:
        os.environ["OPSCOPE_CLOCK_SYNC"] = "0"
    import opscope

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    with opscope.profile() as prof:
        for _ in range(args.steps):
            step()
            prof.step()
    prof.export_chrome_trace(os.path.join(args.outdir, f"train.rank{rank}.pt.trace.json"))
    step()
    token = torch.ones(1)
    dist.all_reduce(token)
    with open(os.path.join(args.outdir, f"done.rank{rank}.txt"), "w") as f:
        f.write(str(int(token.item())))
    # gloo's workers take the GIL to drop the last collective's tensors: give it to them
    # before the group goes or Python exits, or torch may abort or hang (pytorch #190489)
    time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
