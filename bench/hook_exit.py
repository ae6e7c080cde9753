"""The start-up hook's cost: ``import torch`` and process exit, with and without OPSCOPE_ON_DEMAND=1.

Method: each sample is a fresh ``python -c`` process that imports torch and ends (the
``thread`` variant also leaves a program thread that ends 0.2 s after the main thread).
The child prints ``time.monotonic()`` (one system-wide clock) before and after
``import torch`` and when its last Python line has run; the parent takes the same clock
when ``wait()`` returns. Import = after - before; exit = process gone - last line. The
variants with and without the variable are interleaved, rotating, N times each; the
table gives medians in ms. Torch's own exit (about a second here, and noisy) swamps a
few ms, so the child also times what opscope adds to exit: threading's shutdown (where
Python joins non-daemon threads) and opscope's atexit functions; the target is on that. The .pth of the opscope installed in this interpreter is the
hook measured (pip puts it in site-packages); the native cache is the user's.

    python bench/hook_exit.py [--quick] [--json PATH] [-n N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import common

N, N_QUICK = 20, 2

PLAIN = ("import time; print(time.monotonic(), flush=True); import torch; "
         "print(time.monotonic(), flush=True)\n")
THREAD = ("import threading\n"
          "def late(): time.sleep(0.2); print(time.monotonic(), flush=True)\n"
          "threading.Thread(target=late).start()\n")
# opscope's own exit paths, timed in the child: threading's shutdown (joins non-daemon threads)
# and opscope's atexit functions; the printer is registered first, so it runs last
PROBE = (
    "import atexit, threading\n"
    "spent = [0.0]\n"
    "def timed(fn):\n"
    "    def run(*a, **k):\n"
    "        t = time.monotonic()\n"
    "        try: return fn(*a, **k)\n"
    "        finally: spent[0] += time.monotonic() - t\n"
    "    return run\n"
    "atexit.register(lambda: print('paths', spent[0], flush=True))\n"
    "threading._shutdown = timed(threading._shutdown)\n"
    "for name in ('opscope.on_demand', 'opscope.collect.job.store'):\n"
    "    at_exit = getattr(sys.modules.get(name), '_at_exit', None)\n"
    "    if at_exit is not None:\n"
    "        atexit.unregister(at_exit); atexit.register(timed(at_exit))\n")
LAST = "import sys\n" + PROBE + "print(time.monotonic(), flush=True)\n"
PROGRAMS = {"import torch": PLAIN + LAST, "import torch + a program thread": PLAIN + THREAD + LAST}


def sample(code: str, hooked: bool) -> dict:
    """One child: {"import_ms", "exit_ms", "paths_ms"} (exit counted from the last line that
    ran; paths: the time in threading's shutdown and opscope's atexit functions)."""
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_ON_DEMAND"}
    if hooked:
        env["OPSCOPE_ON_DEMAND"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=300)
    gone = time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"hook_exit: the child failed ({proc.returncode}): {err[-2000:]}")
    lines = out.splitlines()
    paths = [float(line.split()[1]) for line in lines if line.startswith("paths ")]
    marks = [float(line) for line in lines if not line.startswith("paths ")]
    return {"import_ms": (marks[1] - marks[0]) * 1e3, "exit_ms": (gone - max(marks[2:])) * 1e3,
            "paths_ms": paths[0] * 1e3}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("-n", type=int, help=f"samples per variant (default {N}, {N_QUICK} quick)")
    args = common.parse_args(p)
    n = args.n or (N_QUICK if args.quick else N)
    variants = {(program, hooked): (lambda c=code, h=hooked: sample(c, h))
                for program, code in PROGRAMS.items() for hooked in (False, True)}
    samples = {k: [] for k in variants}
    names = list(variants)
    for rep in range(n):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(variants[name]())
    rows = []
    for (program, hooked), runs in samples.items():
        rows.append([program, "1" if hooked else "unset",
                     common.median([r["import_ms"] for r in runs]),
                     common.median([r["exit_ms"] for r in runs]),
                     common.median([r["paths_ms"] for r in runs]), len(runs)])
    extra = {program: common.median([r["paths_ms"] for r in samples[(program, True)]])
             - common.median([r["paths_ms"] for r in samples[(program, False)]])
             for program in PROGRAMS}
    result = {
        "title": "Start-up hook: import and exit cost",
        "command": common.command_line("hook_exit.py", ["-n", str(n)]),
        "machine": common.machine_info(),
        "columns": ["program", "OPSCOPE_ON_DEMAND", "import torch (ms, median)",
                    "exit after the last line (ms, median)",
                    "threading shutdown + opscope atexit (ms, median)", "samples"],
        "rows": rows,
        "targets": [common.target("the hook's exit paths (ms, hooked - unset)", extra[p], 10.0,
                                  " ms", p) for p in PROGRAMS],
        "raw": {f"{p} / {'hooked' if h else 'unset'}": runs for (p, h), runs in samples.items()},
    }
    common.finish(result, args)


if __name__ == "__main__":
    main()
