"""What Inductor's per-kernel ranges cost when no profiler runs (opscope turns them on).

One process, one two-block MLP compiled twice (``cpp.enable_kernel_profile`` on, as
opscope sets it, and off, as torch's default), training steps of each timed in
interleaved rounds, no profiler recording. Prints the median step time of each and
the ratio.

    python bench/compiled_kernel_ranges.py [--rounds 15] [--steps 50]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import opscope  # noqa: F401  (installs the notes, as a user's import would)


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.ln = torch.nn.LayerNorm(2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.ln(self.fc1(x))))


def timed(model, x, steps: int) -> float:
    begin = time.perf_counter()
    for _ in range(steps):
        model(x).sum().backward()
    return (time.perf_counter() - begin) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(args.width) for _ in range(4)])
    x = torch.randn(16, args.width)
    variants = {
        "kernel ranges on (opscope)": torch.compile(
            model, options={"cpp.enable_kernel_profile": True}),
        "kernel ranges off (torch default)": torch.compile(
            copy.deepcopy(model), options={"cpp.enable_kernel_profile": False}),
    }
    for compiled in variants.values():
        timed(compiled, x, 3)
    times = {name: [] for name in variants}
    order = list(variants.items())
    for _ in range(args.rounds):
        order.reverse()  # each variant goes first in every other round
        for name, compiled in order:
            times[name].append(timed(compiled, x, args.steps))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:36s} {value * 1e6:10.1f} us/step")
    on, off = medians.values()
    print(f"ratio on/off: {on / off:.3f}")


if __name__ == "__main__":
    main()
