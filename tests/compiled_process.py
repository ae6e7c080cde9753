"""A second process for tests/test_compiled_attribution.py: prints what it profiled, as JSON.

    python tests/compiled_process.py warm   import opscope, compile the test's model (an FX-graph
                                            cache hit when the cache folder is warm), profile
    python tests/compiled_process.py late   import torch, compile, then import opscope, profile
"""

from __future__ import annotations

import json
import sys
import warnings

import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.ln = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.ln(self.fc1(x))))


def main(mode: str) -> None:
    if mode == "warm":
        import opscope
    torch.manual_seed(0)
    compiled = torch.compile(torch.nn.Sequential(Block(), Block()))
    x = torch.randn(8, 32)
    for _ in range(2):
        compiled(x).sum().backward()
    if mode == "late":
        import opscope
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opscope.profile(with_modules=True) as prof:
            compiled(x).sum().backward()
        prof.key_averages()
    from torch._dynamo.utils import counters

    kernels = sorted({(e.name, e.module_hierarchy) for e in prof.events()
                      if "cpp_fused" in e.name or e.name in ("aten::addmm", "aten::mm")})
    print(json.dumps({"kernels": kernels, "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
                      "warnings": [str(w.message) for w in caught
                                   if "opscope" in str(w.message)]}))


if __name__ == "__main__":
    main(sys.argv[1])
