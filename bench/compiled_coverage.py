"""How much of a torch.compile'd model's time opscope attributes to modules and source lines.

Two models (a stack of transformer encoder blocks, a residual conv net) are compiled with
Inductor on CPU and profiled for a few training steps with ``with_modules`` and
``with_stack``. For the time inside the graphs' ``## Call CompiledFxGraph ##`` ranges
(self time of everything inside them, forward and backward), it prints the share that
lies in ops carrying a module below the root, and, of the generated kernels' and extern
calls' time, the share whose stack is a model source line (not Inductor's wrapper).

    python bench/compiled_coverage.py [--steps 3]
"""

from __future__ import annotations

import argparse

import torch

import opscope

CALL = "## Call CompiledFxGraph"


class BasicBlock(torch.nn.Module):
    """A ResNet basic block: two 3x3 convs with batch norm, the residual added inside."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class ResidualConv(torch.nn.Module):
    def __init__(self, channels: int = 16):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3, padding=1, bias=False),
                                        torch.nn.BatchNorm2d(channels), torch.nn.ReLU())
        self.layer1 = torch.nn.Sequential(BasicBlock(channels), BasicBlock(channels))
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(channels, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layer1(self.stem(x))), 1))


class TransformerBlock(torch.nn.Module):
    """A pre-norm GPT block, written as models write it (not torch.nn.TransformerEncoderLayer,
    whose code Dynamo records no source lines for)."""

    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


def models():
    blocks = torch.nn.Sequential(*[TransformerBlock() for _ in range(2)])
    yield "transformer blocks", blocks, torch.randn(4, 16, 64)
    yield "residual conv net", ResidualConv(), torch.randn(4, 3, 16, 16)


def coverage(prof):
    inside = []
    for e in prof.events():
        up = e.cpu_parent
        while up is not None and not up.name.startswith(CALL):
            up = up.cpu_parent
        if up is not None:
            inside.append(e)
    total = sum(e.self_cpu_time_total for e in inside)
    moduled = sum(e.self_cpu_time_total for e in inside if "." in e.module_hierarchy)
    kernels = [e for e in inside if "cpp_fused" in e.name or e.name.startswith("aten::")]
    kernel_time = sum(e.self_cpu_time_total for e in kernels)
    sourced = sum(e.self_cpu_time_total for e in kernels
                  if e.stack and "torchinductor" not in e.stack[0] and "/tmp/" not in e.stack[0])
    return moduled / max(total, 1e-9), sourced / max(kernel_time, 1e-9), len(inside)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    for name, model, x in models():
        compiled = torch.compile(model)
        for _ in range(2):
            compiled(x).sum().backward()
        with opscope.profile(with_modules=True, with_stack=True) as prof:
            for _ in range(args.steps):
                compiled(x).sum().backward()
        modules, lines, n = coverage(prof)
        print(f"{name:20s} time in modules below the root: {modules:6.1%}   "
              f"kernel time with a source line: {lines:6.1%}   ({n} events in graphs)")


if __name__ == "__main__":
    main()
