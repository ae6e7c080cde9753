"""Compile one C++ extension into a private folder; run as a child process.

``python build_worker.py SOURCE BUILD_DIR NAME PARENT_PID`` leaves
``BUILD_DIR/NAME.so`` and exits 0, or exits 1 with the compiler output on
stderr. It runs in its own process so that torch's build chatter (ninja,
compiler, warnings) goes to the build log and never to the profiled job's
terminal, and so that the half-built module is never imported by that job.
``build`` then checks and publishes the library. It imports torch
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
        # a source's own include folders and flags (the device collector's CUPTI headers)
        extra = json.loads(os.environ.get("OPSCOPE_BUILD_EXTRA") or "{}")
        if extra.get("plain"):  # a CPython extension without torch: one compiler call
            return _compile_plain(source, build_dir, name, extra)
        from torch.utils import cpp_extension

        cpp_extension.load(name=name, sources=[source], build_directory=build_dir,
                           extra_cflags=FLAGS + list(extra.get("cflags", [])),
                           extra_include_paths=list(extra.get("include_dirs", [])),
                           verbose=True)
    except BaseException as exc:  # the parent reads the log; the reason goes last
        print(f"\n{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def _compile_plain(source: str, build_dir: str, name: str, extra: dict) -> int:
    """``$CXX`` (else c++) ``-shared`` of ``source`` into ``BUILD_DIR/NAME.so``."""
    import shlex
    import subprocess
    import sysconfig

    command = (shlex.split(os.environ.get("CXX", "").strip() or "c++") + FLAGS
               + ["-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden",
                  f"-DTORCH_EXTENSION_NAME={name}", "-I" + sysconfig.get_paths()["include"]]
               + list(extra.get("cflags", [])) + ["-I" + d for d in extra.get("include_dirs", [])]
               + [source, "-o", os.path.join(build_dir, f"{name}.so")])
    print(" ".join(shlex.quote(c) for c in command), flush=True)
    return subprocess.run(command, stdin=subprocess.DEVNULL).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
