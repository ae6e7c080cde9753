"""A thousand ranks: ``opscope ranks``, ``merge``, ``convert`` and ``ranks`` on the store, 1,024 x 10k.

Writes 1,024 synthetic rank traces of about 10,000 events each in torch 2.13's profiler
format (``bench/store_scale.py``'s generator: Kineto's layout, ``distributedInfo``,
``ProfilerStep#N`` ranges of 1,000 events, nested ``cpu_op`` events with their inputs, per
collective a ``c10d::allreduce_`` op and a ``gloo:all_reduce`` range on a second thread,
so that every rank's collectives match), about 3.4 GiB of JSON; rank ``STRAGGLER`` (mod
the ranks) arrives 10 ms late at every collective. Then runs each command in its own
process, its wall time and the peak RSS of its whole process tree (summed, sampled 10
times a second), and checks the targets of issue 31 and that both ``ranks`` runs name the
straggler first.

    python bench/ranks_thousand.py [--quick] [--json PATH] [--traces DIR] [--jobs N]

``--traces DIR`` generates into DIR (or reuses the traces already there) and keeps them;
without it the traces go to a temporary folder under /tmp, deleted at the end.
``--quick``: 16 ranks x 1,000 events.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import common
import store_scale

RANKS, RANKS_QUICK = 1024, 16
EVENTS, EVENTS_QUICK = 10_000, 1_000
EVENTS_PER_STEP, EVENTS_PER_STEP_QUICK = 1_000, 250
# verb -> seconds allowed on 1,024 x 10k (issue 31); every verb within PEAK_BYTES
LIMITS = {"ranks DIR": 60, "merge": 120, "convert": 180, "ranks STORE": 30}
PEAK_BYTES = 2 * 2 ** 30
_GENERATED = ".generated.json"


def traces(folder: str, world: int, events: int, per_step: int, jobs: int) -> dict:
    """The generator's record of ``folder``'s traces, generating them unless they match."""
    mark = os.path.join(folder, _GENERATED)
    if os.path.exists(mark):
        gen = json.load(open(mark))
        if gen.get("ranks") == world and gen.get("asked") == [events, per_step]:
            return gen
        shutil.rmtree(folder)
    gen = store_scale.generate(folder, world, events, jobs, per_step)
    gen["asked"] = [events, per_step]
    with open(mark, "w") as f:
        json.dump(gen, f)
    return gen


def run_verbs(folder: str, tmp: str, jobs: int) -> dict:
    """Each verb, measured in its own process tree; the ranks runs' first straggler."""
    store = os.path.join(tmp, "job.store")
    argv = {"ranks DIR": ("ranks", folder, "--json"),
            "merge": ("merge", folder, "-o", os.path.join(tmp, "merged.pt.trace.json")),
            "convert": ("convert", folder, "-o", store, "--jobs", str(jobs)),
            "ranks STORE": ("ranks", store, "--json")}
    out = {}
    for label, args in argv.items():
        stdout = os.path.join(tmp, label.replace(" ", "_") + ".out")
        got = store_scale.measured(store_scale.opscope_cmd(*args), stdout)
        got["command"] = "opscope " + " ".join(
            a.replace(store, "STORE").replace(folder, "DIR").replace(tmp + "/", "")
            for a in args)
        if got["returncode"] != 0:
            raise SystemExit(f"ranks_thousand: {got['command']} failed:\n{got['stderr_tail']}")
        if label.startswith("ranks"):
            doc = json.load(open(stdout))
            got["named"] = [s["rank"] for s in doc["stragglers"]]
            got["collectives"] = len(doc["collectives"])
        print(label, {k: v for k, v in got.items() if k != "stderr_tail"}, flush=True)
        out[label] = got
        if label == "merge":
            os.unlink(os.path.join(tmp, "merged.pt.trace.json"))
    return out


def result_of(gen: dict, got: dict, full: bool, jobs: int) -> dict:
    """common.finish's dict of one generation and one run of the verbs."""
    mib = 2 ** 20
    rows, targets = [], []
    for label, limit in LIMITS.items():
        r = got[label]
        named = r.get("named")
        rows.append([label, r["command"], gen["ranks"], gen["events_per_rank"], r["seconds"],
                     r["cpu_seconds"], round(r["peak_rss"] / mib), round(r["peak_pss"] / mib),
                     r["load_average"], "-" if named is None else str(named[:3])])
        targets.append(common.target(f"{label} time (1,024 x 10k)",
                                     r["seconds"] if full else None, limit, " s"))
        targets.append(common.target(f"{label} peak RSS of the process tree (1,024 x 10k), "
                                     f"GiB", r["peak_rss"] / 2 ** 30 if full else None,
                                     PEAK_BYTES / 2 ** 30))
    straggler = gen["straggler"]
    named_ok = all(got[k]["named"][:1] == [straggler] for k in ("ranks DIR", "ranks STORE"))
    notes = [
        f"{gen['ranks']:,} synthetic ranks x {gen['events_per_rank']:,} events "
        f"({gen['ranks'] * gen['events_per_rank']:,} events in {gen['steps']} steps a rank, "
        f"{gen['bytes'] / 2 ** 30:.2f} GiB of torch-format .json, "
        f"{gen['bytes_per_event']:.0f} bytes an event), written by "
        f"`bench/store_scale.py`'s generator in {gen['seconds']:.0f} s.",
        f"Rank {straggler} arrives {store_scale.LATE_US / 1000:g} ms late at every "
        f"collective: both ranks runs named it first "
        f"({'as expected' if named_ok else 'WRONG'}); the last column lists the first "
        f"stragglers named.",
        f"Each command runs in its own process (convert with --jobs {jobs}); peak memory "
        f"is sampled 10 times a second over its whole process tree, RSS summed (shared "
        f"pages counted in every process: the targets use it) and PSS summed. The load "
        f"average shows how busy this shared 2-core host was (above 2, times are "
        f"stretched by other work)."]
    return {"title": "A thousand ranks: ranks, merge, convert and ranks on the store",
            "command": common.command_line("ranks_thousand.py"),
            "machine": common.machine_info(),
            "columns": ["verb", "command", "ranks", "events per rank", "wall s",
                        "CPU s (tree)", "peak RSS MiB (tree)", "peak PSS MiB (tree)",
                        "load avg", "stragglers named"],
            "rows": rows, "targets": targets, "notes": notes, "straggler_named": named_ok,
            "raw": {"gen": gen, "run": {k: {n: x for n, x in v.items() if n != "stderr_tail"}
                                        for k, v in got.items()}}}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--traces", metavar="DIR",
                   help="generate the traces here (or reuse them) and keep them")
    p.add_argument("--jobs", type=int, default=2, help="convert's --jobs (default 2)")
    args = common.parse_args(p)
    world = RANKS_QUICK if args.quick else RANKS
    events = EVENTS_QUICK if args.quick else EVENTS
    per_step = EVENTS_PER_STEP_QUICK if args.quick else EVENTS_PER_STEP
    tmp = tempfile.mkdtemp(prefix="ranks_thousand_", dir="/tmp")
    try:
        folder = args.traces or os.path.join(tmp, "job")
        gen = traces(folder, world, events, per_step, args.jobs)
        got = run_verbs(folder, tmp, args.jobs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = result_of(gen, got, not args.quick, args.jobs)
    common.finish(result, args)
    if not result["straggler_named"]:
        raise SystemExit(f"ranks_thousand: expected rank {gen['straggler']} first among the "
                         f"stragglers")


if __name__ == "__main__":
    main()
