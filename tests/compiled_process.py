"""A second process for tests/test_compiled_attribution.py: prints what it profiled, as JSON.

    python tests/compiled_process.py warm   import opscope, compile the test's model (an FX-graph
                                            cache hit when the cache folder is warm), profile
    python tests/compiled_process.py late   import torch, compile, then import opscope, profile
    python tests/compiled_process.py no-range    as warm, on a torch whose CompiledFxGraph.__call__
                                            opens no call range (as torch 2.8's): one of the
                                            hooks opscope needs is missing

The warnings it prints are opscope's, from the start of the process.
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


def _without_the_call_range() -> None:
    """CompiledFxGraph.__call__ as a torch that opens no range there would have it."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError:  # torch 2.4: no output_code, a hook missing already
        return
    original = CompiledFxGraph.__call__

    def __call__(self, inputs):
        return original(self, inputs)

    CompiledFxGraph.__call__ = __call__


def _in_a_graph(event) -> bool:
    """Run by a compiled graph (not by a compile in the window: torch 2.4 recompiles when
    module hooks appear, its guards being on the global hooks)."""
    up = event.cpu_parent
    while up is not None and not up.name.startswith("CompiledFunction"):
        up = up.cpu_parent
    return up is not None


def main(mode: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = _profile(mode)
    seen["warnings"] = [str(w.message) for w in caught if "opscope" in str(w.message)]
    print(json.dumps(seen))


def _profile(mode: str) -> dict:
    if mode == "no-range":
        _without_the_call_range()
    if mode in ("warm", "no-range"):
        import opscope
    torch.manual_seed(0)
    compiled = torch.compile(torch.nn.Sequential(Block(), Block()))
    x = torch.randn(8, 32)
    for _ in range(2):
        compiled(x).sum().backward()
    if mode == "late":
        import opscope
    with opscope.profile(with_modules=True) as prof:
        compiled(x).sum().backward()
    prof.key_averages()
    from torch._dynamo.utils import counters

    kernels = sorted({(e.name, e.module_hierarchy) for e in prof.events()
                      if ("cpp_fused" in e.name or e.name in ("aten::addmm", "aten::mm"))
                      and _in_a_graph(e)})
    frames = json.loads(prof.session.metadata.get("opscopeCompiledFrames", "{}"))
    return {"kernels": kernels, "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "frames": sorted({entry["name"] for entry in frames.values()})}


if __name__ == "__main__":
    main(sys.argv[1])
