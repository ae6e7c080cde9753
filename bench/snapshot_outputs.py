"""Write every output of a fixed set of sessions to a folder, to diff a refactor's before/after.

A restructuring must not change what opscope prints or writes. Run this on the
old tree and on the new one, then ``diff -r`` the two folders::

    python bench/snapshot_outputs.py --record-inputs /tmp/snap_inputs   # once
    python bench/snapshot_outputs.py /tmp/snap_inputs /tmp/snap_before  # old tree
    python bench/snapshot_outputs.py /tmp/snap_inputs /tmp/snap_after   # new tree
    diff -r /tmp/snap_before /tmp/snap_after

The inputs are saved traces (so times are fixed): two live opscope recordings
of a small training step with every option on (one with a schedule), torch's
own traces under ``tests/torch_traces``, plus a synthetic session built from raw records. For each, every table
variant, the Chrome trace written again, the collapsed stacks, the memory
timeline and summary, the module table and the report are written.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def record_inputs(folder: str) -> None:
    """Two live recordings (all options; with a schedule) saved as traces."""
    import torch

    import opscope

    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 14 * 14, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(4, 3, 16, 16)

    def step():
        with opscope.record_function("forward"):
            loss = model(data).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    options = dict(record_shapes=True, profile_memory=True, with_stack=True,
                   with_flops=True, with_modules=True)
    with opscope.profile(**options) as prof:
        for _ in range(2):
            step()
    prof.export_chrome_trace(os.path.join(folder, "live_all.json"))
    sched = opscope.schedule(wait=1, warmup=1, active=2)
    with opscope.profile(schedule=sched, **options) as prof:
        for _ in range(4):
            step()
            prof.step()
    prof.export_chrome_trace(os.path.join(folder, "live_sched.json.gz"))
    with opscope.profile() as prof:
        step()
    prof.export_chrome_trace(os.path.join(folder, "live_default.json"))
    for path in glob.glob(os.path.join(ROOT, "tests", "torch_traces", "*.trace.json.gz")):
        shutil.copy(path, folder)


def _load(path):
    try:
        from opscope.analysis.build import load_session
    except ImportError:
        from opscope.analysis.trace_loader import load_session
    return load_session(path)


def _cli(out: str, name: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "opscope", *args], capture_output=True,
                          text=True, cwd=ROOT)
    with open(os.path.join(out, name), "w") as f:
        f.write(f"rc={done.returncode}\n{done.stdout}\n--- stderr\n{done.stderr}")


def _safe(out: str, name: str, fn) -> None:
    try:
        fn()
    except Exception as e:  # the error text is part of the snapshot
        with open(os.path.join(out, name + ".error"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")


def snapshot_session(session, out: str) -> None:
    """Every export of one session into ``out``."""
    from opscope.analysis.aggregate import session_key_averages
    from opscope.event_list import EventList
    from opscope.export.chrome_trace import write_chrome_trace
    from opscope.export.stacks import write_stacks
    from opscope.report import write_report

    os.makedirs(out, exist_ok=True)
    opts = session.options

    def tables():
        with open(os.path.join(out, "tables.txt"), "w") as f:
            for kw in ({}, {"group_by_input_shape": True}, {"group_by_stack_n": 3}):
                rows = session_key_averages(session, **kw)
                ev = EventList(rows, profile_memory=opts.get("profile_memory", False),
                               with_flops=opts.get("with_flops", False))
                for sort in ("self_cpu_time_total", "count", "cpu_time_total"):
                    f.write(f"== {kw} {sort}\n")
                    f.write(ev.table(sort_by=sort, row_limit=-1))
    _safe(out, "tables", tables)
    _safe(out, "trace", lambda: write_chrome_trace(session, os.path.join(out, "trace.json")))
    _safe(out, "stacks", lambda: write_stacks(session, os.path.join(out, "stacks.txt")))
    for metric in ("self_cpu_time_total", "self_cpu_memory_usage", "cpu_time_total"):
        _safe(out, "stacks_" + metric, lambda m=metric: write_stacks(
            session, os.path.join(out, f"stacks_{m}.txt"), m))
    _safe(out, "report", lambda: write_report(session, os.path.join(out, "report.html")))

    def memory():
        from opscope.export.memory_summary import format_memory_summary
        from opscope.export.memory_timeline import write_memory_timeline

        with open(os.path.join(out, "memory_summary.txt"), "w") as f:
            f.write(format_memory_summary(session, top=10))
        write_memory_timeline(session, os.path.join(out, "memtl.json"), "cpu")
        write_memory_timeline(session, os.path.join(out, "memtl.raw.json.gz"), "cpu")
    if session.memory is not None:
        _safe(out, "memory", memory)

    def modules():
        from opscope.analysis.modules import module_rows
        from opscope.event_list import ModuleList

        with open(os.path.join(out, "module_table.txt"), "w") as f:
            f.write(ModuleList(module_rows(session), with_flops=opts.get("with_flops")).table())
    if session.modules is not None:
        _safe(out, "modules", modules)


def snapshot(inputs: str, out: str) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    traces = sorted(os.listdir(inputs))
    for name in traces:
        path = os.path.join(inputs, name)
        snapshot_session(_load(path), os.path.join(out, name))
        _cli(out, name + ".cli_table.txt", "table", path, "--limit", "-1")
        _cli(out, name + ".cli_table_shape.txt", "table", path, "--group-by", "shape")
        _cli(out, name + ".cli_table_stack.txt", "table", path, "--group-by", "stack:2")
        _cli(out, name + ".cli_table_module.txt", "table", path, "--group-by", "module")
        _cli(out, name + ".cli_report.txt", "report", path, "-o",
             os.path.join(out, name + ".cli_report.html"))
    a, b = os.path.join(inputs, traces[0]), os.path.join(inputs, traces[-1])
    _cli(out, "cli_diff.txt", "diff", a, b)
    from report_sessions import large_session

    snapshot_session(large_session(20_000), os.path.join(out, "synthetic_large"))
    _normalise(out)


def _normalise(out: str) -> None:
    """Drop what differs between two runs of the same tree: gzip headers, the
    random trace id, the output folder's path and the report's generation time."""
    import gzip
    import re

    for path in glob.glob(os.path.join(out, "**", "*.gz"), recursive=True):
        if not os.path.isfile(path):
            continue
        with gzip.open(path, "rb") as f:
            data = f.read()
        os.remove(path)
        with open(path[:-3] + ".unzipped", "wb") as f:
            f.write(data)
    for path in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        text = text.replace(out, "OUT")
        text = re.sub(r'"trace_id": "[0-9A-F]*"', '"trace_id": ""', text)
        text = re.sub(r'"generated(_at)?": "[^"]*"', '"generated": ""', text)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record-inputs", metavar="DIR")
    parser.add_argument("inputs", nargs="?")
    parser.add_argument("out", nargs="?")
    args = parser.parse_args()
    if args.record_inputs:
        record_inputs(args.record_inputs)
    if args.inputs and args.out:
        snapshot(args.inputs, args.out)


if __name__ == "__main__":
    main()
