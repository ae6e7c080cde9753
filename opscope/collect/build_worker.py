"""Compile one C++ extension into a private folder; run as a child process.

``python build_worker.py SOURCE BUILD_DIR NAME PARENT_PID`` leaves
``BUILD_DIR/NAME.so`` and exits 0, or exits 1 with the compiler output on
stderr. It runs in its own process so that torch's build chatter (ninja,
compiler, warnings) goes to the build log and never to the profiled job's
terminal, and so that the half-built module is never imported by that job.
``native_build`` then checks and publishes the library. It imports torch
only, never opscope.
"""

from __future__ import annotations

import json
import os
import signal
import sys

FLAGS = ["-O2", "-DNDEBUG"]


def _die_with(parent_pid: int) -> None:
    """Ask Linux to kill this worker when the process that started it dies."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the temp folder is cleaned up next run
        return
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(1)


def main(argv: list) -> int:
    source, build_dir, name, parent_pid = argv
    _die_with(int(parent_pid))
    try:
        from torch.utils import cpp_extension

        # a source's own include folders and flags (the device collector's CUPTI headers)
        extra = json.loads(os.environ.get("OPSCOPE_BUILD_EXTRA") or "{}")
        cpp_extension.load(name=name, sources=[source], build_directory=build_dir,
                           extra_cflags=FLAGS + list(extra.get("cflags", [])),
                           extra_include_paths=list(extra.get("include_dirs", [])),
                           verbose=True)
    except BaseException as exc:  # the parent reads the log; the reason goes last
        print(f"\n{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
