"""Small real training workloads shared by tests: forward, backward, optimizer step."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3, classes: int = 4):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


def mlp_step_fn(seed: int = 0):
    """A closure running one MLP train step (SGD)."""
    torch.manual_seed(seed)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step


def transformer_step_fn(seed: int = 0):
    """A closure running one train step of a small transformer encoder layer (Adam)."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                       dropout=0.0, batch_first=True)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
    x = torch.randn(2, 8, 32)

    def step():
        opt.zero_grad()
        loss = layer(x).pow(2).mean()
        loss.backward()
        opt.step()

    return step


def torch_profiler_trace(path):
    """One MLP step (after a warm-up) profiled by the real torch.profiler, its trace
    written to ``path``; returns the torch profiler."""
    import torch.profiler

    step = mlp_step_fn()
    step()
    with torch.profiler.profile() as prof:
        step()
    prof.export_chrome_trace(str(path))
    return prof
