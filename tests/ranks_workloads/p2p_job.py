"""A 2-rank gloo job of Python-issued collectives and point-to-point ops, no DDP.

    torchrun --nproc-per-node 2 p2p_job.py OUTDIR

Under a plain ``opscope.profile()`` (no record_shapes, no with_stack), twice: an
all_reduce, a send and its recv, an isend and its irecv back, a batch_isend_irecv
exchange, an all_gather on a second group and a barrier; then a last all_reduce of 4
elements on rank 0 and 2 on rank 1, on a group of its own (a desync: the job then
fails on that group's 4-second timeout). Each rank writes OUTDIR/job.rank<R>.pt.trace.json
(in a ``finally:``) and OUTDIR/state.rank<R>.txt: whether torch's ProcessGroup methods were
put back at stop, and whether torch._inductor was ever imported (it is what makes the
flight recorder's own stacks readable).
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import opscope


def exchange(rank, pair):
    if rank == 0:
        dist.send(torch.ones(5), 1)
        dist.irecv(torch.zeros(3, dtype=torch.float64), 1).wait()
    else:
        dist.recv(torch.zeros(5), 0)
        dist.isend(torch.ones(3, dtype=torch.float64), 0).wait()
    ops = [dist.P2POp(dist.isend, torch.ones(7), 1 - rank),
           dist.P2POp(dist.irecv, torch.zeros(7), 1 - rank)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out = [torch.zeros(6) for _ in range(2)]
    dist.all_gather(out, torch.full((6,), float(rank)), group=pair)


def main(folder):
    torch.set_num_threads(1)
    # a minute to meet (one rank may start seconds after the other on a loaded machine)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    short = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=4))  # for the desync
    methods = {m: torch._C._distributed_c10d.ProcessGroup.__dict__[m] for m in ("send", "allreduce")}
    prof = opscope.profile()
    try:
        with prof:
            for _ in range(2):
                dist.all_reduce(torch.ones(4))
                exchange(rank, pair)
                dist.barrier()
            dist.all_reduce(torch.ones(4 if rank == 0 else 2), group=short)  # the desync
    finally:
        prof.export_chrome_trace(os.path.join(folder, f"job.rank{rank}.pt.trace.json"))
        state = {"restored": all(torch._C._distributed_c10d.ProcessGroup.__dict__[m] is f
                                 for m, f in methods.items()),
                 "inductor_imported": "torch._inductor" in sys.modules}
        with open(os.path.join(folder, f"state.rank{rank}.txt"), "w") as f:
            json.dump(state, f)
    time.sleep(0.1)  # gloo's workers drop the last tensors (pytorch #190489)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
