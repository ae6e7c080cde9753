"""The black box's cost while it runs: step time, memory, and what a dump stalls.

Three measurements, in one process, in this order:

- Memory (first, so the native region pool starts near empty): a tiny-op loop
  (``torch.add`` on 2-element tensors, one thread) runs for longer than ``seconds`` under
  ``opscope.blackbox(seconds=5, max_mb=16)``, sampling every 1,000 ops the bytes the box
  keeps (``box._ring.bytes + box._live_bytes()``) and the RSS: their maxima against
  ``max_mb`` and the RSS before, with a stated fixed overhead (the native pool's 8 free
  2 MiB regions, plus one 2 MiB region per recording thread). Rotations are timed, and so
  is the loop's longest gap between two ops.
- Step time: the transformer LM and conv net of ``bench/workloads.py`` (target 1.03) and
  the tiny-op loop, each repetition running the workload unprofiled, under an empty
  RecordFunction observer (bench/empty_observer.py: the floor of any observer) and under
  a fresh black box with the default settings (started and stopped outside the timed
  part), in rotating order (``common.interleaved``), one intra-op thread as overhead.py.
- Dump: a box with seconds=60, max_mb=128 records 1M tiny ops; then a second thread runs
  a tiny-op loop while ``box.dump()`` (wait=False) is called: the time ``dump()`` takes
  to return, that thread's longest gap between two ops until the background write has
  finished (the stall the job sees), both per 1M ops in the ring, and the write time.

    python bench/black_box_cost.py [--quick] [--json PATH] [--reps N] [--threads N]
"""

from __future__ import annotations

import gc
import os
import tempfile
import threading
import time

import torch

import common
from workloads import make_workload

REPS = {"transformer": 61, "convnet": 81, "tiny_ops": 101}
STEP_LIMIT = 1.03  # black box / unprofiled, transformer and convnet
MEMORY = {"seconds": 5.0, "max_mb": 16.0, "run_s": 12.0}
MEMORY_QUICK = {"seconds": 1.0, "max_mb": 4.0, "run_s": 2.0}
DUMP_OPS, DUMP_OPS_QUICK = 1_000_000, 50_000
STALL_MS_PER_M = 50.0  # per 1M ops in the ring
MIB = 2 ** 20
REGION = 2 * MIB  # native region: the live window grows by these
FIXED = 8 * REGION + REGION  # the pool of 8 free regions, one live region per thread


def start_box(folder: str, **options):
    import opscope

    box = opscope.blackbox(dir=folder, **options)
    box.start()
    if not box.running:
        raise SystemExit("black_box_cost: the black box did not start (no native collector)")
    return box


def stop_box(box) -> None:
    """Stop ``box``; remove the optimizer hook it installed (stop() leaves it there)."""
    from opscope.step_tracker import untrack_optimizer_steps

    box.stop()
    untrack_optimizer_steps()


def tiny_adds():
    a, b = torch.ones(2), torch.ones(2)
    return lambda: torch.add(a, b)


def measure_cost(workload, reps: int, warmup: bool, folder: str) -> dict:
    """Wall and process CPU seconds per repetition: unprofiled, under an empty
    RecordFunction observer (the floor of any observer), and under a fresh black box."""
    from empty_observer import empty_observer

    dumps, cpu = [], {}

    def clocked(name, enter=None):  # enter() sets the variant up, returns what undoes it
        def run() -> float:
            leave = enter() if enter else None
            try:
                gc.collect()
                c0, t0 = time.process_time(), time.perf_counter()
                workload.run()
                wall = time.perf_counter() - t0
                cpu.setdefault(name, []).append(time.process_time() - c0)
                return wall
            finally:
                if leave:
                    leave()
        return run

    def observer():
        cm = empty_observer()
        cm.__enter__()
        return lambda: cm.__exit__(None, None, None)

    def black_box():
        box = start_box(folder)

        def leave():
            stop_box(box)
            dumps.extend(box.dumps)
        return leave

    variants = {"unprofiled": clocked("unprofiled"),
                "empty observer": clocked("empty observer", observer),
                "black box": clocked("black box", black_box)}
    if warmup:
        for run in variants.values():
            run()
        dumps.clear()
        cpu.clear()
    samples = common.interleaved(variants, reps)
    return {"samples_s": samples, "cpu_s": cpu, "dumps": len(dumps)}


def measure_memory(folder: str, seconds: float, max_mb: float, run_s: float) -> dict:
    """Kept bytes and RSS growth of a tiny-op loop run for ``run_s`` under a small box."""
    from opscope.collect.native.build import load_native

    native = load_native()
    add = tiny_adds()
    for _ in range(50_000):  # warm: the loop's own memory is resident before the baseline
        add()
    warm = start_box(folder, seconds=seconds, max_mb=max_mb)  # imports, first-use pages
    for _ in range(1000):
        add()
    stop_box(warm)
    gc.collect()
    pool_before = native.pooled_region_bytes()
    base_rss = common.rss_bytes()
    box = start_box(folder, seconds=seconds, max_mb=max_mb)
    rotations = []
    rotate = box._rotate

    def timed_rotate():
        t0 = time.perf_counter()
        rotate()
        rotations.append(time.perf_counter() - t0)

    box._rotate = timed_rotate  # the monitor thread looks it up on the instance
    kept_max = rss_max = ops = 0
    gaps = []
    start = prev = time.perf_counter()
    while prev - start < run_s:
        gap = 0.0
        for _ in range(1000):
            add()
            now = time.perf_counter()
            gap = max(gap, now - prev)
            prev = now
        gaps.append(gap)
        ops += 1000
        with box._lock:  # not between a window's close and the next one's start
            kept_max = max(kept_max, box._ring.bytes + box._live_bytes())
        rss_max = max(rss_max, common.rss_bytes())
    stop_box(box)
    gc.collect()
    return {"seconds": seconds, "max_mb": max_mb, "run_s": prev - start, "ops": ops,
            "kept_max_bytes": kept_max, "rss_growth_max_bytes": rss_max - base_rss,
            "rss_growth_after_stop_bytes": common.rss_bytes() - base_rss,
            "pool_before_bytes": pool_before, "pool_after_bytes": native.pooled_region_bytes(),
            "rotations_s": rotations,
            "chunk_max_gap_s": gaps, "dumps": len(box.dumps)}


def op_loop(add, stop: threading.Event, gaps: list) -> None:
    """Run ``add`` until ``stop``; append (start, length) of each gap over 1 ms between two
    consecutive ops to ``gaps``."""
    prev = time.perf_counter()
    while not stop.is_set():
        add()
        now = time.perf_counter()
        if now - prev > 1e-3:
            gaps.append((prev, now - prev))
        prev = now


def measure_dump(folder: str, ops: int) -> dict:
    """``dump()``'s return time, the longest gap a concurrent op loop sees until the
    write is done, and the write time, with a ring of ``ops`` tiny ops (plus the loop's)."""
    box = start_box(folder, seconds=60, max_mb=128)
    add = tiny_adds()
    for _ in range(ops):
        add()
    stop, gaps = threading.Event(), []
    loop = threading.Thread(target=op_loop, args=(tiny_adds(), stop, gaps))
    loop.start()
    time.sleep(0.5)  # the loop alone: its gaps without a dump
    live = box._live_bytes()
    t0 = time.perf_counter()
    path = box.dump()
    t1 = time.perf_counter()
    in_ring = sum(len(w.records) for w in box._ring.windows())
    for writer in list(box._writers):
        writer.join()
    t2 = time.perf_counter()
    time.sleep(0.05)
    stop.set()
    loop.join()
    size = os.path.getsize(path) if path and os.path.exists(path) else None
    stop_box(box)

    def longest(lo, hi):  # the longest gap that overlaps [lo, hi]
        return max([g for at, g in gaps if at < hi and at + g > lo] or [0.0])

    return {"ops_recorded": ops, "ops_in_ring": in_ring, "live_bytes": live,
            "return_s": t1 - t0, "write_s": t2 - t1, "stall_s": longest(t0, t2),
            "stall_call_s": longest(t0, t1), "stall_write_s": longest(t1, t2),
            "stall_before_s": longest(t0 - 0.45, t0 - 1e-4), "file_bytes": size,
            "gaps_over_1ms": [(at - t0, g) for at, g in gaps]}


def ops_per_run(workload) -> int:
    """Ops one run of ``workload`` records (an opscope.profile window, not timed)."""
    import opscope

    with opscope.profile() as prof:
        workload.run()
    return len(prof.events())


def cost_rows(args, folder: str, default_threads: int):
    rows, raw, targets = [], [], []
    for name in ("transformer", "convnet", "tiny_ops"):
        w = make_workload(name, quick=args.quick)
        torch.set_num_threads(w.threads or args.threads or default_threads)
        reps = args.reps or (2 if args.quick else REPS[name])
        m = measure_cost(w, reps, warmup=not args.quick, folder=folder)
        m["ops_per_run"] = ops_per_run(w)
        s, cpu = m["samples_s"], m["cpu_s"]
        base, box = common.median(s["unprofiled"]), common.median(s["black box"])
        raw.append({
            "workload": name, "description": w.description, "reps": reps,
            "threads": torch.get_num_threads(), "unprofiled_s": base, "black_box_s": box,
            "black_box_over_unprofiled": common.ratio(box, base),
            "paired_ratio": common.median([b / u for b, u in zip(s["black box"],
                                                                 s["unprofiled"])]),
            "empty_observer_over_unprofiled": common.ratio(common.median(s["empty observer"]),
                                                           base),
            "cpu_ratio": common.ratio(common.median(cpu["black box"]),
                                      common.median(cpu["unprofiled"])),
            "unprofiled_iqr_over_median": common.spread(s["unprofiled"]),
            "black_box_iqr_over_median": common.spread(s["black box"]), **m})
        torch.set_num_threads(default_threads)
    # The tiny-op loop's cost per op (median of paired differences), scaled to each step's
    # ops: what the per-op cost alone predicts, where the steps' own noise hides it.
    tiny = raw[-1]["samples_s"]
    per_op = common.median([b - u for b, u in zip(tiny["black box"], tiny["unprofiled"])]
                           ) / raw[-1]["ops_per_run"]
    for r in raw:
        r["per_op_us"] = per_op * 1e6
        r["predicted_ratio"] = 1 + per_op * r["ops_per_run"] / r["unprofiled_s"]
        rows.append([r["workload"], r["reps"], r["unprofiled_s"] * 1e3,
                     pct(r["unprofiled_iqr_over_median"]), r["black_box_s"] * 1e3,
                     pct(r["black_box_iqr_over_median"]), r["black_box_over_unprofiled"],
                     r["paired_ratio"], r["empty_observer_over_unprofiled"], r["cpu_ratio"],
                     r["ops_per_run"], r["predicted_ratio"], r["dumps"]])
        if r["workload"] != "tiny_ops":
            targets.append(common.target(
                f"{r['workload']}: black box / unprofiled ≤ {STEP_LIMIT}",
                r["black_box_over_unprofiled"], STEP_LIMIT, "x",
                f"unprofiled IQR {pct(r['unprofiled_iqr_over_median'])}, paired "
                f"{r['paired_ratio']:.3f}, empty observer "
                f"{r['empty_observer_over_unprofiled']:.3f}, CPU time {r['cpu_ratio']:.3f}, "
                f"predicted from the tiny-op cost per op {r['predicted_ratio']:.4f}"))
    return rows, raw, targets


def memory_part(mem: dict):
    """The memory targets and the note with its table."""
    max_b, rot, gaps = mem["max_mb"] * MIB, mem["rotations_s"], mem["chunk_max_gap_s"]
    targets = [
        common.target(f"memory: kept bytes ≤ max_mb + one 2 MiB region per recording thread "
                      f"({mem['max_mb']:g} + 2 MiB)", mem["kept_max_bytes"] / MIB,
                      (max_b + REGION) / MIB, " MiB", "ring + live window, sampled"),
        common.target(f"memory: RSS growth ≤ max_mb + fixed overhead ({mem['max_mb']:g} + "
                      f"{FIXED // MIB} MiB)", mem["rss_growth_max_bytes"] / MIB,
                      (max_b + FIXED) / MIB, " MiB",
                      f"{mem['rss_growth_after_stop_bytes'] / MIB:.1f} MiB left after stop")]
    table = common.markdown_table(
        ["seconds", "max_mb", "run s", "ops", "kept max MiB", "RSS growth max MiB",
         "RSS growth after stop MiB", "pool before / after MiB", "rotations",
         "rotation ms median / max", "loop's longest gap ms (median of 1k-op chunks)"],
        [[mem["seconds"], mem["max_mb"], mem["run_s"], mem["ops"], mem["kept_max_bytes"] / MIB,
          mem["rss_growth_max_bytes"] / MIB, mem["rss_growth_after_stop_bytes"] / MIB,
          f"{mem['pool_before_bytes'] / MIB:g} / {mem['pool_after_bytes'] / MIB:g}", len(rot),
          f"{common.median(rot) * 1e3:.1f} / {max(rot) * 1e3:.1f}" if rot else "n/a",
          f"{max(gaps) * 1e3:.1f} ({common.median(gaps) * 1e3:.3f})"]])
    note = ("Memory (tiny-op loop, one recording thread, under a small box):\n\n" + table
            + "\n\n'kept' is `box._ring.bytes + box._live_bytes()` (the live window counted in "
            "whole 2 MiB regions), sampled under the box's lock every 1,000 ops; RSS growth is "
            "over the RSS before the box started (after a first box was started and stopped, "
            "so imports and first-use pages are in the baseline). The stated fixed overhead "
            f"is {FIXED // MIB} MiB: the native pool's 8 free 2 MiB regions (16 MiB, kept "
            "after stop for the next window) and one 2 MiB region per recording thread (1 "
            "here) of overshoot. A rotation (timed around `box._rotate`, on the monitor "
            "thread) closes the live window, its records copied out of the regions, and opens "
            "the next.")
    return targets, note


def dump_part(dump: dict):
    """The dump targets and the note with its table."""
    per_m = 1e6 / max(1, dump["ops_in_ring"])
    ret_ms, stall_ms = dump["return_s"] * 1e3, dump["stall_s"] * 1e3
    targets = [
        common.target(f"dump() returns within {STALL_MS_PER_M:g} ms per 1M ops in the ring",
                      ret_ms * per_m, STALL_MS_PER_M, " ms/1M ops",
                      f"{ret_ms:.1f} ms, {dump['ops_in_ring']:,} ops"),
        common.target(f"the job's longest stall during the dump ≤ {STALL_MS_PER_M:g} ms per "
                      "1M ops in the ring", stall_ms * per_m, STALL_MS_PER_M, " ms/1M ops",
                      f"{stall_ms:.1f} ms; the write took {dump['write_s']:.2f} s in the "
                      "background")]
    gaps = [f"{dump[k] * 1e3:.1f}" if dump[k] else "< 1"
            for k in ("stall_call_s", "stall_write_s", "stall_before_s")]
    table = common.markdown_table(
        ["ops in ring", "live window MiB", "dump() returns ms", "longest gap ms: in dump() "
         "/ in the write / 0.45 s before", "ms per 1M ops: return / gap", "write s",
         "file MB"],
        [[dump["ops_in_ring"], dump["live_bytes"] / MIB, ret_ms, " / ".join(gaps),
          f"{ret_ms * per_m:.1f} / {stall_ms * per_m:.1f}", dump["write_s"],
          (dump["file_bytes"] or 0) / 1e6]])
    note = (f"Dump (seconds=60, max_mb=128, {dump['ops_recorded']:,} tiny ops recorded by the "
            "main thread, then a second thread's tiny-op loop runs during the dump; the ring "
            "also holds that loop's ops):\n\n" + table + "\n\nA gap is between two consecutive "
            "ops of the second thread: while `dump()` runs (it closes the live window, whose "
            "records the native stop copies without holding the GIL; its time follows the live "
            "window's size, up to a quarter of max_mb), while the writer thread builds and "
            "writes the trace, and over the 0.45 s before the call (the box running, no dump; "
            "a rotation may fall there). Gaps under 1 ms are not kept; the GIL's switch "
            "interval is 5 ms.")
    return targets, note


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, help="repetitions per workload (default: 61 "
                   "transformer, 81 convnet, 101 tiny_ops; 2 with --quick)")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads for transformer and convnet (tiny_ops: always 1); "
                        "default 1; 0 keeps torch's default")
    args = common.parse_args(p)
    t_start = time.perf_counter()
    collector = common.prepare_opscope()
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mem_cfg = MEMORY_QUICK if args.quick else MEMORY
    dump_ops = DUMP_OPS_QUICK if args.quick else DUMP_OPS
    with tempfile.TemporaryDirectory() as folder:
        mem = measure_memory(folder, **mem_cfg)
        torch.set_num_threads(default_threads)
        rows, raw, targets = cost_rows(args, folder, default_threads)
        torch.set_num_threads(1)
        dump = measure_dump(folder, dump_ops)
        torch.set_num_threads(default_threads)

    mem_targets, mem_note = memory_part(mem)
    dump_targets, dump_note = dump_part(dump)
    notes = [
        f"opscope collector: {collector}. Step time: medians in ms of the workload, each "
        "repetition running it unprofiled, under an empty RecordFunction observer "
        "(bench/empty_observer.py: the floor of any observer) and under a fresh black box "
        "with the default settings (seconds=30, max_mb=64, slow_step=3; started and stopped "
        "outside the timed part, so no rotation falls inside), in rotating order after one "
        "warm-up of each (none with --quick). The optimizer hook a box installs is removed "
        "after each stop. 'ratio' is the ratio of the medians (the target); 'paired' the "
        "median of each repetition's ratio; 'CPU time ratio' the ratio of the medians of "
        "the process's CPU time (all threads), less stretched by other processes. 'IQR' is "
        "interquartile range / median: a cost smaller than the unprofiled IQR is not "
        "resolved, and ratios below 1 are noise. 'predicted ratio' is 1 + the tiny-op "
        "loop's cost per op (median of its paired differences black box - unprofiled, over "
        "its ops) x the workload's ops per run / its unprofiled time: what the per-op cost "
        "alone adds. 'dumps': slow_step dumps written during timed runs. Intra-op threads: "
        f"{args.threads or default_threads} (tiny_ops: 1).",
        "Workloads: " + "; ".join(f"{r['workload']}: {r['description']}" for r in raw) + ".",
        mem_note, dump_note, f"Whole run: {time.perf_counter() - t_start:.0f} s."]
    common.finish({"title": "Black box: cost while running",
                   "command": common.command_line("black_box_cost.py"),
                   "machine": common.machine_info(),
                   "columns": ["workload", "reps", "unprofiled ms", "unprofiled IQR",
                               "black box ms", "black box IQR", "ratio", "paired",
                               "empty observer ratio", "CPU time ratio", "ops per run",
                               "predicted ratio", "dumps"],
                   "rows": rows, "targets": targets + mem_targets + dump_targets,
                   "notes": notes,
                   "raw": {"cost": raw, "memory": mem, "dump": dump}}, args)


if __name__ == "__main__":
    main()
