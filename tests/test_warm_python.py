"""tests/warm_python.py: a fork of the warm Python ends as ``python ARGV`` would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warm_python import WarmPython

SCRIPT = "import sys\nprint(__name__, sys.argv, sys.path[0])\nraise KeyError(1)\n"
CASES = {
    "argv and exit status": ["-c", "import sys; print(sys.argv, sys.path[0]); sys.exit(3)", "a"],
    "exit with a message": ["-c", "import sys; sys.exit('stopping here')"],
    "traceback": ["-c", "def f():\n    raise ValueError('x')\nf()"],
    "folder and environment": ["-c", "import os; print(os.getcwd(), os.environ['WARM_TEST'])"],
    "threads joined, then atexit": [
        "-c", "import atexit, threading, time\natexit.register(print, 'atexit')\n"
              "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()"],
    "module": ["-m", "json.tool", "--help"],
    "script": ["script.py", "arg"],
    "PYTHONPATH": ["-c", "import sys; print([p for p in sys.path if p.endswith('extra')])"],
}


@pytest.fixture(scope="module")
def warm():
    with WarmPython(["json"]) as server:
        yield server


@pytest.mark.parametrize("case", list(CASES))
def test_a_fork_ends_as_the_interpreter_does(warm, tmp_path, case):
    (tmp_path / "script.py").write_text(SCRIPT)
    env = dict(os.environ, WARM_TEST="yes", PYTHONPATH=str(tmp_path / "extra"))
    real = subprocess.run([sys.executable, *CASES[case]], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    forked = warm.run(CASES[case], env=env, cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (real.returncode, real.stdout, real.stderr)


def test_a_fork_past_its_timeout_is_killed_with_its_group(warm):
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(["-c", "import os, time; os.close(1); os.close(2); time.sleep(60)"], timeout=1)
    assert warm.run(["-c", "print('next')"], timeout=60).stdout == "next\n"
