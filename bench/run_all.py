"""Run every benchmark at full size and write BENCHMARKS.md (atomically).

    python bench/run_all.py [--quick] [--output PATH] [--from-json DIR]

Each script runs in its own process, one after the other, and saves its result with
``--json``; the document is rendered from those results only. ``--from-json DIR``
renders the document from results saved earlier as ``DIR/<script>.json``, running nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import common

# The document's sections by subject, each a list of scripts in the order they run.
SUBJECTS = (
    ("Recording cost", ("overhead.py", "instructions.py", "record_function_idle.py",
                        "feature_costs.py", "collector_memory.py", "black_box_cost.py")),
    ("After the run: post-processing and size", ("postprocess.py", "trace_size.py",
                                                 "ten_million.py")),
    ("Many ranks", ("ranks_scale.py", "ranks_thousand.py")),
)
SCRIPTS = tuple(script for _, scripts in SUBJECTS for script in scripts)


def run_script(script: str, quick: bool, folder: str) -> dict:
    out = Path(folder) / (script + ".json")
    cmd = [sys.executable, str(common.BENCH_DIR / script), "--json", str(out)]
    if quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run_all: {script} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["script"] = script
    result["elapsed_s"] = time.perf_counter() - t0
    return result


# Why a target can be missed, by script: shown only for a script with a target not met in
# the run rendered, so the text never outlives the figures. No figure is typed here: each
# is in the script's table.
LIMITS = {
    "overhead.py": (
        "The `empty observer ratio` column is torch's RecordFunction machinery alone: a "
        "do-nothing global callback (`empty_observer_start` in the native observer). On "
        "steps made of tiny ops it is most of the budget, so no observer of RecordFunction "
        "events can meet a tight target there; the feature-costs table splits the cost per "
        "op into the machinery's row and opscope's own row. With record_shapes, "
        "with_stack and profile_memory the floor is higher still: the empty observer with "
        "inputs boxes every op's arguments, and the hooks that name memory categories send "
        "every module call down nn.Module's slow path."),
    "postprocess.py": (
        "torch.profiler's `export_chrome_trace` copies a file that Kineto already wrote in "
        "C++, so a fraction of it is about what opscope's `__exit__` alone takes. Our "
        "exporters render event lines in bulk with numpy (`opscope/export/json_rows.py`); "
        "with record_shapes the rows are about twice as wide."),
    "record_function_idle.py": (
        "The idle path is one global check, but creating the object, `__enter__` and "
        "`__exit__` are three Python calls: the table's 'plain Python context manager' row "
        "is that floor on the same machine in the same run."),
    "black_box_cost.py": (
        "A step bound by dispatch (the conv net: an op every few µs) pays RecordFunction's "
        "machinery for every op: the `empty observer ratio` column is that floor, which no "
        "observer that keeps every op goes below. Sampling would, at the price of estimates "
        "(see the section)."),
}
HOST_NOTE = ("Absolute figures (µs per event, seconds) move with the host and its load; "
             "torch's own figures in the same run move by the same factor. Compare ratios "
             "within one run.")


def targets_table(results: List[dict]) -> List[str]:
    """One row per target of every script: its verdict, computed from its figure."""
    out = ["## Targets", "", "| status | subject | target | measured | reproduce |",
           "|---|---|---|---|---|"]
    subject_of = {script: subject for subject, scripts in SUBJECTS for script in scripts}
    for r in results:
        for t in r.get("targets", []):
            shown = {"NOT MET": "**not met**"}.get(common.status(t), common.status(t))
            out.append(f"| {shown} | {subject_of.get(r.get('script'), '')} | {t['target']} "
                       f"| {t['measured']} | `{t.get('command') or r['command']}` |")
    return out + [""]


def limits_part(results: List[dict]) -> List[str]:
    """Why the targets missed in this run can be missed (scripts with none are left out)."""
    missed = [r for r in results if r.get("script") in LIMITS
              and any(common.status(t) == "NOT MET" for t in r.get("targets", []))]
    if not missed:
        return []
    out = ["## What limits the targets not met", ""]
    out += [f"- **{r['title']}.** {LIMITS[r['script']]}" for r in missed]
    return out + [f"- {HOST_NOTE}", ""]


def render_document(results: List[dict], quick: bool = False) -> str:
    """BENCHMARKS.md from the scripts' results."""
    m = results[0]["machine"]
    total = sum(r.get("elapsed_s", 0.0) for r in results)
    took = f" ({total / 60:.1f} min)" if total else ""
    out = ["# opscope benchmarks", "",
           f"Generated {m['date']} at commit `{m['commit']}` by `python bench/run_all.py`"
           f"{took}. Regenerate with that one command; every figure comes "
           "from the scripts in `bench/`, and the command beside it reproduces it.", "",
           f"Machine: {common.machine_line(m)}.", "",
           "Method: torch.profiler and opscope run in the same process, interleaved "
           "(rotating order every repetition), several repetitions; figures are medians, "
           "never single times. The machine is shared and noisy (see the load average), so "
           "compare ratios measured in the same run rather than times across runs.", ""]
    if quick:
        out += ["**Generated with --quick: tiny sizes; the figures mean nothing.**", ""]
    commits = list(dict.fromkeys(r["machine"]["commit"] for r in results))
    if len(commits) > 1:
        out += ["**The code changed during this run**: each section names the commit it "
                "measured (" + "; then ".join(f"`{c}`" for c in commits) + "), so sections "
                "may not agree with each other.", ""]
    out += targets_table(results) + limits_part(results)
    by_script = {r.get("script"): r for r in results}
    for subject, scripts in SUBJECTS:
        part = [by_script[s] for s in scripts if s in by_script]
        if not part:
            continue
        out += [f"## {subject}", ""]
        for r in part:
            out.append(common.render(r, heading="###").rstrip() + "\n")
            if "elapsed_s" in r:
                out.append(f"_(ran in {r['elapsed_s']:.0f} s)_\n")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every script")
    p.add_argument("--output", default=str(common.REPO / "BENCHMARKS.md"),
                   help="document to write (default: BENCHMARKS.md in the repository root)")
    p.add_argument("--keep-json", metavar="DIR",
                   help="also keep each script's results as DIR/<script>.json")
    p.add_argument("--from-json", metavar="DIR",
                   help="render from DIR/<script>.json (saved with --json) instead of running")
    args = p.parse_args()
    results = []
    if args.from_json:
        for script in SCRIPTS:
            path = Path(args.from_json) / (script + ".json")
            if not path.exists():
                raise SystemExit(f"run_all: --from-json: {path} not found (save it with "
                                 f"python bench/{script} --json {path})")
            results.append({**json.loads(path.read_text()), "script": script})
        common.write_atomic(args.output, render_document(
            results, any(r.get("quick") for r in results)))
        print(f"run_all: wrote {args.output}", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep_json or tmp
        os.makedirs(folder, exist_ok=True)
        for script in SCRIPTS:
            print(f"run_all: {script} ...", file=sys.stderr, flush=True)
            results.append(run_script(script, args.quick, folder))
            print(f"run_all: {script} done in {results[-1]['elapsed_s']:.0f} s",
                  file=sys.stderr, flush=True)
    common.write_atomic(args.output, render_document(results, args.quick))
    print(f"run_all: wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
