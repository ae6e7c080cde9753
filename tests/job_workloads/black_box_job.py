"""A training loop under opscope's black box, in the mode ``argv[1]`` names.

Run by tests/test_black_box_jobs.py.

Modes: ``slow`` (20 steps, step 12 made slow by a ``injected_stall`` range, then an
uncaught exception), ``stall`` (8 steps, then a 13 s hang; it prints whether the stall dump
was written during the hang), ``loop`` (steps until killed; prints ``ready``), ``crash``
(ops for a second, then ``ctypes.string_at(0)``), ``memory`` (tiny ops for ``argv[3]``
seconds under seconds=5, max_mb=8, printing the largest ring + live bytes and the RSS
growth as JSON), ``ranks`` (a 2-rank gloo job: rank 1 dumps at step 10). ``argv[2]`` is
the dumps' folder. Without ``env`` the script starts the black box itself.
"""

import ctypes
import json
import os
import resource
import sys
import time

import torch

import opscope


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i, slow=False):
        loss = model(torch.randn(16, 32)).sum()
        loss.backward()
        if slow:
            with torch.profiler.record_function("injected_stall"):
                time.sleep(0.4)
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)

    if mode == "ranks":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    box = None
    if os.environ.get("OPSCOPE_BLACKBOX") != "1":
        box = opscope.blackbox(dir=folder, seconds=5 if mode == "memory" else 20,
                               max_mb=8 if mode == "memory" else 64)
        box.start()

    if mode == "slow":
        for i in range(20):
            step(i, slow=i == 12)
        raise RuntimeError("the training loop failed on purpose")
    elif mode == "stall":
        for i in range(8):
            step(i)
        time.sleep(13)  # a hang: no step for 13 s
        names = os.listdir(folder)
        print(json.dumps({"stall_dump_during_hang": any(".stall." in n for n in names)}))
    elif mode == "loop":
        print("ready", flush=True)
        i = 0
        while True:
            step(i)
            i += 1
    elif mode == "crash":
        x = torch.ones(4)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            with torch.profiler.record_function("before_the_crash"):
                torch.add(x, x)
        print("crashing", flush=True)
        ctypes.string_at(0)
    elif mode == "memory":
        x = torch.ones(2)
        seconds = float(sys.argv[3])
        start = time.monotonic()
        rss = []
        largest = 0
        while time.monotonic() - start < seconds:
            for _ in range(500):  # about 100k ops a second: the ring fills 8 MB in 2 s
                torch.add(x, x)
            time.sleep(0.004)
            largest = max(largest, box._ring.bytes + box._live_bytes())
            if not rss or time.monotonic() - start > len(rss):
                rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        print(json.dumps({"largest_ring_bytes": largest, "max_bytes": 8 * 2 ** 20,
                          "rss": rss, "windows": len(box._ring.windows())}))
    elif mode == "ranks":
        rank = dist.get_rank()
        for i in range(30):
            step(i)
            for p in model.parameters():
                dist.all_reduce(p.grad if p.grad is not None else torch.zeros(1))
            if rank == 1 and i == 10:
                box.dump("manual")
        time.sleep(2)  # the other rank's dump is written within a poll or two
        box.stop()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
