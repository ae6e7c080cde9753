"""The model ``opscope demo`` trains: a tiny transformer block on random data.

Example::

    >>> TinyBlock(dim=16, heads=2, classes=3)(torch.zeros(2, 4, 16)).shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import torch
from torch import nn

import opscope


class TinyBlock(nn.Module):
    """Pre-norm self-attention and MLP with residuals, then a classifier head.

    >>> TinyBlock(dim=16, heads=2, classes=3)(torch.zeros(2, 4, 16)).shape
    torch.Size([2, 3])
    """

    def __init__(self, dim: int = 64, heads: int = 4, classes: int = 10):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(dim=1))


def train(steps: int, on_step) -> None:
    """Train TinyBlock on random data for ``steps`` steps, calling ``on_step()`` after each."""
    torch.manual_seed(0)
    model = TinyBlock()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    inputs = torch.randn(steps, 8, 16, 64)
    targets = torch.randint(0, 10, (steps, 8))
    for i in range(steps):
        with opscope.record_function("forward"):
            loss = loss_fn(model(inputs[i]), targets[i])
        with opscope.record_function("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        optimizer.step()
        on_step()
