"""Instructions per compiled training step, with opscope imported and no profiler, against a process without opscope.

``import opscope`` turns on Inductor's per-kernel ranges (``cpp.enable_kernel_profile``)
and notes each kernel's call sites in the generated code; with no profiler running, a
compiled step should cost within 2% of a process that never imported opscope. Wall time
on this shared 2-core machine moves by more than that between runs
(bench/compiled_kernel_ranges.py: 1.007-1.039x), so this script counts instructions.

Method: a child process compiles a 4-block MLP (width 64, batch 16, SGD) into a fresh
Inductor cache folder, natively, once per variant (``import opscope`` or not). Then, per
variant, the child runs under ``valgrind --tool=callgrind --instr-atstart=no`` twice, with
N and 2N training steps: it loads the graphs from that cache, runs 3 warm-up steps
uninstrumented, switches instrumentation on (``callgrind_control -i on``) and runs the
steps. The difference of the two totals, over N, is one step's instructions (start-up,
warm-up and exit cancel out).

    python bench/compiled_idle_instructions.py [--steps 20] [--json PATH] [--quick]
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import common
from instructions import child_python, instrument_on, total_instructions

VARIANTS = {"without opscope": False, "import opscope (kernel ranges on)": True}


def child(with_opscope: bool, steps: int, instrument: bool) -> None:
    """Compile (or load), warm up, then ``steps`` counted training steps."""
    if with_opscope:
        import opscope  # noqa: F401
    import torch

    from compiled_kernel_ranges import Block

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(*[Block(64) for _ in range(4)]))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x).sum().backward()
        optimizer.step()

    for _ in range(3):
        step()
    gc.collect()
    gc.disable()
    if instrument:
        instrument_on()
    for _ in range(steps):
        step()
    print(json.dumps({"ok": True}), flush=True)


# valgrind 3.19 decodes no AVX-512 (an EVEX prefix is an illegal instruction to it), and
# Inductor compiles for the host (-march=native, its widest vector ISA): on an AVX-512 host
# the counted runs died with SIGILL. Both variants compile for AVX2 instead.
VALGRIND_ISA = {"TORCHINDUCTOR_CPP_MARCH": "x86-64-v3", "ATEN_CPU_CAPABILITY": "avx2"}


def child_env(cache: str) -> dict:
    isa = VALGRIND_ISA if platform.machine() == "x86_64" else {}
    return dict(os.environ, PYTHONHASHSEED="0", OPSCOPE_QUIET_BUILD="1",
                TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1",
                PYTHONPATH=os.pathsep.join([str(common.REPO), str(common.BENCH_DIR),
                                            os.environ.get("PYTHONPATH", "")]), **isa)


def run(cmd: list, env: dict) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=common.REPO)
    if proc.returncode != 0:
        raise SystemExit(f"compiled_idle_instructions.py: {' '.join(cmd[:3])}... failed "
                         f"({proc.returncode}):\n{proc.stderr[-3000:]}")


def counted(with_opscope: bool, steps: int, cache: str, folder: Path) -> int:
    """Total instructions of a child that runs ``steps`` steps after instrumentation."""
    out = folder / f"callgrind.{int(with_opscope)}.{steps}.out"
    run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         child_python(), __file__, "--child", json.dumps([with_opscope, steps, True])],
        child_env(cache))
    return total_instructions(str(out))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(*json.loads(sys.argv[2]))
        return
    parser = common.parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = common.parse_args(parser)
    steps = 2 if args.quick else args.steps
    per_step = {}
    with tempfile.TemporaryDirectory(prefix="opscope-idle-") as tmp:
        for name, with_opscope in VARIANTS.items():
            cache = os.path.join(tmp, f"cache{int(with_opscope)}")
            run([sys.executable, __file__, "--child", json.dumps([with_opscope, 1, False])],
                child_env(cache))  # compile natively; the counted runs load from the cache
            low = counted(with_opscope, steps, cache, Path(tmp))
            high = counted(with_opscope, 2 * steps, cache, Path(tmp))
            per_step[name] = (high - low) / steps
    base, ours = per_step.values()
    result = {
        "title": "torch.compile'd step with opscope imported, no profiler: instructions",
        "command": common.command_line("compiled_idle_instructions.py",
                                       ["--steps", str(args.steps)]),
        "machine": common.machine_info(),
        "columns": ["process", "instructions per training step", "vs without opscope"],
        "rows": [[name, round(value), f"{value / base:.4f}x"]
                 for name, value in per_step.items()],
        "targets": [common.target("compiled step, opscope imported, no profiler, within 2% "
                                  "of a process without opscope", ours / base, 1.02, "x")],
        "notes": [f"callgrind, ({2 * steps} - {steps} steps) / {steps}; 1 intra-op thread; "
                  "graphs loaded from a warm Inductor cache made by each variant"],
        "raw": per_step,
    }
    common.finish(result, args)


if __name__ == "__main__":
    main()
