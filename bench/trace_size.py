"""Trace size: bytes of torch.profiler's .json, opscope's .json and opscope's .json.gz.

Each repetition profiles the same workload under torch.profiler and under opscope (in
rotating order) and writes the traces; sizes are medians over repetitions.

    python bench/trace_size.py [--quick] [--json PATH] [--reps N]
"""

from __future__ import annotations

import os
import tempfile

import common
from workloads import make_workload

CONFIGS = ("default", "record_shapes")
STEPS, STEPS_QUICK = 20, 2


def write_traces(make, config: dict, workload, folder: str, suffixes) -> dict:
    with make(**config) as prof:
        workload.run()
    sizes = {"events": len(prof.events())}
    for suffix in suffixes:
        path = os.path.join(folder, "trace" + suffix)
        prof.export_chrome_trace(path)
        sizes[suffix] = os.path.getsize(path)
        os.unlink(path)
    return sizes


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, help="repetitions (default 3, 1 with --quick)")
    args = common.parse_args(p)
    collector = common.prepare_opscope()
    workload = make_workload("mlp", steps=STEPS_QUICK if args.quick else STEPS)
    reps = args.reps or (1 if args.quick else 3)
    profs = common.profilers()
    rows, raw, targets = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for cname in CONFIGS:
            config = common.CONFIGS[cname]
            got = {"torch": [], "opscope": []}
            variants = {
                "torch": lambda: got["torch"].append(
                    write_traces(profs["torch"], config, workload, folder, [".json"])) or 0.0,
                "opscope": lambda: got["opscope"].append(
                    write_traces(profs["opscope"], config, workload, folder,
                                 [".json", ".json.gz"])) or 0.0,
            }
            common.interleaved(variants, reps)

            def med(name, key):
                return int(common.median([g[key] for g in got[name]]))

            tj, oj, og = med("torch", ".json"), med("opscope", ".json"), med("opscope", ".json.gz")
            nt, no = med("torch", "events"), med("opscope", "events")
            rows.append([cname, nt, no, tj, oj, og, tj / nt, oj / no, og / no, oj / tj, og / tj])
            raw.append({"config": cname, "torch": got["torch"], "opscope": got["opscope"]})
            targets.append(common.target(f"{cname}: opscope .json.gz ≤ 1/3 of torch's .json",
                                         og / tj, 1 / 3, where=f"{og:,} vs {tj:,} bytes"))
            targets.append(common.target(f"{cname}: opscope .json no larger than torch's .json",
                                         oj / tj, 1.0, where=f"{oj:,} vs {tj:,} bytes"))
    notes = [f"opscope collector: {collector}. Workload: {workload.description}; {reps} "
             "repetitions, torch and opscope alternating; sizes are medians. Ratios are to "
             "torch's .json. Event counts are `len(prof.events())` of the same runs."]
    common.finish({"title": "Trace size", "command": common.command_line("trace_size.py"),
                   "machine": common.machine_info(),
                   "columns": ["config", "torch events", "opscope events", "torch .json B",
                               "opscope .json B", "opscope .json.gz B", "torch B/event",
                               "opscope .json B/event", "opscope .gz B/event",
                               "opscope json/torch json", "opscope gz/torch json"],
                   "rows": rows, "targets": targets, "notes": notes, "raw": raw}, args)


if __name__ == "__main__":
    main()
