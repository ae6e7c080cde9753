"""The issue's four workloads, each a zero-argument callable that runs the timed work.

A workload is built once (model, optimizer, data) and then called many times; only the
call is timed. ``threads`` is the intra-op thread count it is measured with.

Example::

    >>> w = make_workload("mlp", quick=True)
    >>> w.run()
    >>> w.name, w.threads
    ('mlp', None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn


@dataclass
class Workload:
    name: str
    description: str
    run: Callable[[], None]
    threads: Optional[int] = None  # None: torch's default


def tiny_ops(n: int) -> Workload:
    """``n`` × ``torch.add`` on 2-element tensors, single-threaded."""
    a, b = torch.ones(2), torch.ones(2)

    def run():
        add = torch.add
        for _ in range(n):
            add(a, b)

    return Workload("tiny_ops", f"{n} x torch.add on 2-element tensors, 1 thread", run, threads=1)


def _train_loop(model: nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int,
                loss_fn) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run():
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(model(x), target).backward()
            opt.step()

    return run


def mlp(steps: int) -> Workload:
    """8 × Linear(16,16) with ReLU between, batch 4, SGD, ``steps`` train steps."""
    torch.manual_seed(0)
    layers = []
    for i in range(8):
        layers.append(nn.Linear(16, 16))
        if i < 7:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    return Workload("mlp", f"8 x Linear(16,16), batch 4, SGD, {steps} steps",
                    _train_loop(model, x, y, steps, nn.functional.mse_loss))


def transformer(steps: int, seq: int = 128, batch: int = 8) -> Workload:
    """nn.TransformerEncoderLayer(d_model 256, 4 heads), seq 128, batch 8, SGD."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                       dropout=0.0, batch_first=True)
    x = torch.randn(batch, seq, 256)
    return Workload("transformer",
                    f"encoder layer d_model 256, 4 heads, ff 1024, seq {seq}, batch {batch}, "
                    f"SGD, {steps} steps",
                    _train_loop(model, x, torch.randn_like(x), steps, nn.functional.mse_loss))


def convnet(steps: int, batch: int = 16) -> Workload:
    """Two 3×3 convs (3→16→32), pooling, linear head; batch 16 of 3×32×32; SGD."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10))
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    return Workload("convnet",
                    f"conv 3-16-32 3x3, pool, linear; batch {batch} x 3x32x32, SGD, {steps} steps",
                    _train_loop(model, x, y, steps, nn.functional.cross_entropy))


# name -> (builder, full-size arguments, --quick arguments)
WORKLOADS = {
    "tiny_ops": (tiny_ops, {"n": 20_000}, {"n": 2_000}),
    "mlp": (mlp, {"steps": 200}, {"steps": 20}),
    "transformer": (transformer, {"steps": 3}, {"steps": 1, "seq": 16, "batch": 2}),
    "convnet": (convnet, {"steps": 20}, {"steps": 2, "batch": 2}),
}
NAMES = tuple(WORKLOADS)


def make_workload(name: str, quick: bool = False, **size) -> Workload:
    """Build workload ``name`` at its full (or ``quick``) size; ``size`` overrides either."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(NAMES)}")
    build, full, small = WORKLOADS[name]
    return build(**{**(small if quick else full), **size})
