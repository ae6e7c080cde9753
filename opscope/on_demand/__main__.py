"""``python -m opscope.on_demand SCRIPT [ARGS...]``: run a program ready for ``opscope trigger``.

For programs that never import opscope: on-demand profiling is enabled, then
SCRIPT runs as ``__main__`` with its own arguments, unprofiled until
``opscope trigger PID`` asks. The exit status is the script's.

Example::

    $ python -m opscope.on_demand train.py --epochs 3 &
    $ opscope trigger $! --steps 5 -o traces/
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

USAGE = "usage: python -m opscope.on_demand SCRIPT [ARGS...]"


def main(argv: Optional[List[str]] = None) -> int:
    """Enable on-demand profiling, run the script; return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\nRun SCRIPT with on-demand profiling enabled; profile it later "
              "with: opscope trigger PID --steps N -o DIR",
              file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    script, args = argv[0], argv[1:]
    if not os.path.isfile(script):
        print(f"opscope: error: argument SCRIPT: script {script!r} not found", file=sys.stderr)
        return 2
    from opscope.script import run_script
    from opscope.on_demand import enable_on_demand

    try:
        enable_on_demand()
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"opscope: error: cannot enable on-demand profiling: {exc}", file=sys.stderr)
        return 2
    outcome = run_script(script, args)
    sys.stdout.flush()
    outcome.report()
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
