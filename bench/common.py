"""Shared pieces of the bench scripts: machine description, interleaved timing, output.

Every script builds one *result* dict and hands it to :func:`finish`, which prints it as
markdown and saves it with ``--json``. ``run_all.py`` renders the same dicts into
BENCHMARKS.md, so stdout and the document cannot disagree.

A result holds: ``title``, ``command`` (reproduces every figure in it), ``machine``,
``columns`` and ``rows`` (the table), ``targets`` (``{"target", "measured", "met"}``),
``notes`` (lines of text) and ``raw`` (every sample, for ``--json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent

# The profiler configurations of the issue; the same flags go to both profilers.
CONFIGS: Dict[str, dict] = {
    "default": {},
    "record_shapes": {"record_shapes": True},
    # the "record_shapes + with_stack + profile_memory" target
    "shapes_stack_memory": {"record_shapes": True, "with_stack": True, "profile_memory": True},
    "all_on": {"record_shapes": True, "profile_memory": True, "with_stack": True,
               "with_flops": True, "with_modules": True},
}


def profilers() -> Dict[str, Callable]:
    """``{"torch": torch.profiler.profile, "opscope": opscope.profile}``."""
    import torch.profiler

    import opscope

    return {"torch": torch.profiler.profile, "opscope": opscope.profile}


def prepare_opscope() -> str:
    """Build/load the native observer before anything is timed; returns the collector name."""
    import opscope
    from opscope.collect import choose_collector

    opscope.kineto_available()
    settle()
    return choose_collector().name


def settle() -> None:
    """Collect garbage, then freeze what is left (torch's many long-lived objects).

    Later ``gc.collect()`` calls then cost microseconds instead of ~0.15 s.
    """
    gc.collect()
    gc.freeze()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def git_commit() -> str:
    """Short commit of the checkout, marked when opscope/ differs from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "opscope"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + uncommitted changes in opscope/" if dirty else "")


def machine_info() -> dict:
    """What the figures were measured on."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "commit": _start_commit or git_commit(), "date": time.strftime("%Y-%m-%d"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def machine_line(m: dict) -> str:
    load = m.get("load_average")
    load_text = f"; load average {load[0]:.2f} at the end" if load else ""
    return (f"{m['cpu']}, {m['cores']} cores; torch {m['torch']}; Python {m['python']}; "
            f"opscope commit {m['commit']}; {m['date']}{load_text}")


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: Sequence[float]) -> Optional[float]:
    """Interquartile range over median: how noisy the samples were (None under 4)."""
    if len(xs) < 4:
        return None
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return (q3 - q1) / median(xs)


def timed(fn: Callable[[], None]) -> float:
    """Seconds one call of ``fn`` takes, after a garbage collection."""
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(variants: Dict[str, Callable[[], float]], reps: int) -> Dict[str, List[float]]:
    """Run each variant once per repetition, rotating the order every repetition.

    Each variant returns its own measured seconds (so it can leave set-up out).
    Rotation spreads slow phases of a noisy machine over all variants alike.
    """
    names = list(variants)
    samples: Dict[str, List[float]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(variants[name]())
    return samples


_quick = False
_start_commit: Optional[str] = None


def parse_args(p: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse the command line; remembers ``--quick`` for :func:`command_line`.

    Also notes the commit now, before opscope is imported: that is the code measured,
    whatever is committed while the benchmark runs.
    """
    global _quick, _start_commit
    args = p.parse_args()
    _quick = bool(args.quick)
    _start_commit = git_commit()
    return args


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and 1-2 repetitions (CI smoke run; figures meaningless)")
    p.add_argument("--json", metavar="PATH", help="also save the result and raw samples here")
    return p


def command_line(script: str, args: Sequence[str] = ()) -> str:
    """The command that reproduces a figure, run from the repository root."""
    extra = ["--quick"] if _quick else []
    return " ".join(["python", f"bench/{script}", *map(shlex.quote, [*args, *extra])])


def ratio(a: float, b: float) -> Optional[float]:
    return a / b if b > 0 else None


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def target(text: str, measured: Optional[float], limit: float, unit: str = "",
           where: str = "", command: Optional[str] = None) -> dict:
    """One target line: met when ``measured`` ≤ ``limit``; ``command`` reproduces it."""
    met = measured is not None and measured <= limit
    shown = "n/a" if measured is None else f"{fmt(measured, 4)}{unit}"
    return {"target": text, "measured": shown + (f" ({where})" if where else ""), "met": met,
            "command": command}


def status(t: dict) -> str:
    """How a target line reads: met, not met, or not comparable (the work differs)."""
    if t.get("comparable") is False:
        return "not comparable"
    return "met" if t["met"] else "NOT MET"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(c) for c in row) + " |")
    return "\n".join(lines)


def render(result: dict, heading: str = "##") -> str:
    """A result as markdown: heading, machine, command, table, targets, notes."""
    out = [f"{heading} {result['title']}", "",
           f"Machine: {machine_line(result['machine'])}", "",
           f"Reproduce: `{result['command']}`", ""]
    if result.get("quick"):
        out += ["**--quick run: tiny sizes, figures are not meaningful.**", ""]
    out += [markdown_table(result["columns"], result["rows"]), ""]
    if result.get("targets"):
        out += ["Targets:", ""]
        for t in result["targets"]:
            out.append(f"- {status(t)}: {t['target']}: "
                       f"measured {t['measured']}; `{t.get('command') or result['command']}`")
        out.append("")
    for note in result.get("notes", []):
        out += [note, ""]
    return "\n".join(out)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def finish(result: dict, args: argparse.Namespace) -> None:
    """Print the result as markdown; save it as JSON when ``--json`` was given."""
    result.setdefault("quick", bool(args.quick))
    print(render(result))
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")


def run_child(script: str, args: Sequence[str], timeout: float = 600) -> dict:
    """Run ``bench/<script> args`` in a fresh interpreter; it prints one JSON line last."""
    proc = subprocess.run([sys.executable, str(BENCH_DIR / script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hotspots(fn: Callable[[], None], n: int = 3) -> str:
    """Run ``fn`` once under cProfile; its ``n`` functions with the most self time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values()) or 1.0
    top = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    parts = []
    for (path, line, func), (_, calls, self_s, _, _) in top:
        where = f"{Path(path).name}:{line}" if line else path
        parts.append(f"{func} ({where}) {100 * self_s / total:.0f}% self, {calls:,} calls")
    return "; ".join(parts)


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """This process's current resident set (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS line (Linux only)")
