"""Record fixed workloads under each option set and write their Chrome traces, times removed.

A change to the collector's hot path must not change what is recorded. This script
records the same reference sessions (a tiny-op loop with a user range, and MLP train
steps) under each option set, writes each Chrome trace, and normalises what differs from
run to run whatever the code: time values (``ts``, ``dur``, ``baseTimeNanoseconds``), the
process and thread ids (numbered in order of appearance, sort indexes too), allocation
addresses (an allocation's number, in order, and the same number on its free), the trace id and the trace's own path. Everything else must be
byte-identical between two commits:

    python bench/trace_identity.py --out before/      # at the old commit
    python bench/trace_identity.py --out after/       # at the new one
    python bench/trace_identity.py --compare before/ after/

``--compare`` prints the first differing line of each file that differs and exits 1 if
any does.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

OPTION_SETS: Dict[str, dict] = {
    "default": {},
    "record_shapes": {"record_shapes": True},
    "with_stack": {"with_stack": True},
    "profile_memory": {"profile_memory": True},
    "all_on": {"record_shapes": True, "with_stack": True, "profile_memory": True,
               "with_flops": True, "with_modules": True},
}
TIME_KEYS = ("ts", "dur", "baseTimeNanoseconds")


def workloads() -> Dict[str, Callable[[], None]]:
    """The reference sessions: each a callable, built here with fixed seeds."""
    import torch
    from torch import nn

    import opscope

    torch.manual_seed(0)
    a, b = torch.ones(2), torch.ones(2)

    def tiny_ops() -> None:
        with opscope.record_function("tiny block"):
            for _ in range(50):
                torch.add(a, b)
        torch.cat([a, b]).sum()

    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 16), torch.randn(4, 4)

    def mlp() -> None:
        for _ in range(2):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    return {"tiny_ops": tiny_ops, "mlp": mlp}


def normalise(trace: dict) -> dict:
    """The trace with run-dependent values replaced (see the module docstring)."""
    ids: Dict[tuple, int] = {}

    def renumber(kind: str, value):
        if isinstance(value, int):
            return ids.setdefault((kind, value), len([k for k in ids if k[0] == kind]))
        return value

    live: Dict[int, int] = {}
    count = [0]

    def allocation_number(addr, nbytes) -> object:
        # malloc's choice of address varies; which free ends which allocation does not
        if not isinstance(addr, int):
            return addr
        if nbytes > 0:
            count[0] += 1
            live[addr] = count[0]
            return count[0]
        return live.pop(addr, "allocated before")

    def clean(obj, key=None):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if k in TIME_KEYS:
                    out[k] = 0
                elif k in ("pid", "tid"):
                    out[k] = renumber(k, v)
                elif k == "Addr":
                    out[k] = allocation_number(v, obj.get("Bytes", 0))
                else:
                    out[k] = clean(v, k)
            if obj.get("name") in ("process_sort_index", "thread_sort_index"):
                out["args"] = {"sort_index": 0}
            return out
        if isinstance(obj, list):
            return [clean(v) for v in obj]
        return obj

    out = clean(trace)
    for k in ("trace_id", "traceName"):
        if k in out:
            out[k] = k
    return out


def record_all(out_dir: Path) -> None:
    import torch

    import opscope

    torch.set_num_threads(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    works = workloads()
    for wname, work in works.items():
        work()  # warm-up: lazy initialisation stays out of the traces
    with tempfile.TemporaryDirectory() as tmp:
        for oname, options in OPTION_SETS.items():
            for wname, work in works.items():
                with opscope.profile(**options) as prof:
                    work()
                raw = Path(tmp) / f"{wname}.{oname}.json"
                prof.export_chrome_trace(str(raw))
                trace = normalise(json.loads(raw.read_text()))
                text = json.dumps(trace, indent=0, sort_keys=False) + "\n"
                (out_dir / f"{wname}.{oname}.json").write_text(text)
                print(f"{wname}.{oname}: {len(trace.get('traceEvents', []))} events")


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    differing = 0
    for name in names:
        fa, fb = a / name, b / name
        if not (fa.exists() and fb.exists()):
            print(f"{name}: only in {fa.parent if fa.exists() else fb.parent}")
            differing += 1
            continue
        la, lb = fa.read_text().splitlines(), fb.read_text().splitlines()
        if la == lb:
            print(f"{name}: identical ({len(la)} lines)")
            continue
        differing += 1
        diff = list(difflib.unified_diff(la, lb, str(fa), str(fb), n=2, lineterm=""))
        print(f"{name}: DIFFERS\n" + "\n".join(diff[:20]))
    print(f"{len(names) - differing} of {len(names)} traces identical")
    return 1 if differing else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder to write the normalised traces to")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="compare two folders written by --out")
    args = p.parse_args()
    if args.compare:
        sys.exit(compare(Path(args.compare[0]), Path(args.compare[1])))
    if not args.out:
        p.error("give --out DIR or --compare BEFORE AFTER")
    record_all(Path(args.out))


if __name__ == "__main__":
    main()
