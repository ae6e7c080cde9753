"""Run a command in its own process group, killing the whole group if it hangs.

Tests that start real processes (the CLI, a training script, a fork scenario) use this, so a
hang fails one test instead of the suite, and no grandchild outlives it.

    >>> run_in_group([sys.executable, "-c", "print(6 * 7)"], timeout=60).stdout
    '42\\n'
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys  # noqa: F401  (the example uses it)
from typing import Optional, Sequence

import pytest


def run_in_group(cmd: Sequence[str], *, timeout: float, env: Optional[dict] = None,
                 cwd=None, text: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end; on timeout kill its process group and fail the test."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=text, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))[:200]} did not finish in {timeout} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)





def fill_disk(folder) -> None:
    """Fill the file system holding ``folder`` (a small tmpfs) to its last block; the write
    that finds it full must fail with ENOSPC."""
    import errno

    with pytest.raises(OSError) as full:
        with open(os.path.join(folder, "filler"), "wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
    assert full.value.errno == errno.ENOSPC
