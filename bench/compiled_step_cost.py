"""A torch.compile'd training step under no profiler, opscope.profile() and torch.profiler.

One process, one 4-block MLP compiled once with opscope imported (so its kernels carry
Inductor's per-kernel ranges, as every user's do), an SGD optimizer. Each round runs
``--steps`` training steps (forward, backward, optimizer step) with no profiler, inside
``opscope.profile()`` and inside ``torch.profiler.profile()`` (CPU activity), in an order
that turns every round; start and stop are outside the timed steps. Prints the median
step time of each and the ratios.

    python bench/compiled_step_cost.py [--rounds 15] [--steps 30] [--json PATH]
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.profiler

import opscope
from compiled_kernel_ranges import Block
import common


def profiler_contexts():
    """name -> a function giving a fresh context manager for one round."""
    return {
        "no profiler": contextlib.nullcontext,
        "opscope.profile()": opscope.profile,
        "torch.profiler": lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]),
    }


def timed_steps(model, optimizer, x, steps: int, context) -> float:
    """Seconds per training step of ``steps`` steps inside ``context()``."""
    with context():
        begin = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            model(x).sum().backward()
            optimizer.step()
        elapsed = time.perf_counter() - begin
    return elapsed / steps


def main() -> None:
    parser = common.parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = common.parse_args(parser)
    if args.quick:
        args.rounds, args.steps = 2, 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(*[Block(args.width) for _ in range(4)]))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, args.width)
    contexts = profiler_contexts()
    for context in contexts.values():  # compile, and each profiler's first-use set-up
        timed_steps(model, optimizer, x, 3, context)
    samples = common.interleaved(
        {name: (lambda c=context: timed_steps(model, optimizer, x, args.steps, c))
         for name, context in contexts.items()}, args.rounds)
    med = {name: common.median(values) for name, values in samples.items()}
    none, ours, theirs = (med[name] for name in contexts)
    result = {
        "title": "torch.compile'd training step: opscope.profile() vs torch.profiler",
        "command": common.command_line("compiled_step_cost.py", [
            "--rounds", str(args.rounds), "--steps", str(args.steps),
            "--width", str(args.width), "--threads", str(args.threads)]),
        "machine": common.machine_info(),
        "columns": ["profiler", "us/step (median)", "vs no profiler"],
        "rows": [[name, value * 1e6, f"{value / none:.3f}x (spread "
                  f"{common.fmt(common.spread(samples[name]))})"]
                 for name, value in med.items()],
        "targets": [{"target": "compiled step under opscope.profile() <= torch.profiler",
                     "measured": f"{ours / none:.3f}x vs {theirs / none:.3f}x",
                     "met": ours <= theirs}],
        "notes": [f"{args.rounds} interleaved rounds of {args.steps} steps; 4-block MLP "
                  f"(width {args.width}, batch 16), {args.threads} intra-op thread(s)"],
        "raw": samples,
    }
    common.finish(result, args)


if __name__ == "__main__":
    main()
