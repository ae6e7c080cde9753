"""A 2-rank gloo job whose rank 0 also issues collectives in a subgroup of its own.

    torchrun --nproc-per-node 2 subgroup_job.py OUTDIR [STEPS]

Every step: an all_reduce on the whole job, one on the subgroup [0] (rank 0 only),
a broadcast and a barrier; 3 steps, or STEPS each ended by ``prof.step()``. Each rank
writes OUTDIR/job.rank<R>.pt.trace.json.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import opscope


def main(folder: str, steps: int = 0) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    solo = dist.new_group([0])  # every rank takes part in creating it; only rank 0 is in it
    tensor = torch.ones(16)
    with opscope.profile(record_shapes=True) as prof:
        for _ in range(steps or 3):
            dist.all_reduce(tensor)
            if rank == 0:
                dist.all_reduce(tensor, group=solo)
            dist.broadcast(tensor, 0)
            dist.barrier()
            if steps:
                prof.step()
    prof.export_chrome_trace(os.path.join(folder, f"job.rank{rank}.pt.trace.json"))
    # gloo's workers take the GIL to drop the last collective's tensors: give it to them
    # before the group goes or Python exits, or torch may abort or hang (pytorch #190489)
    time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:3]))
