"""Moved to :mod:`opscope.script` (rank 4, so ``on_demand`` may use it); kept for ``cli/run.py``."""
from opscope.script import SIGINT_EXIT, ScriptOutcome, run_script, script_environment  # noqa: F401
