"""The native observer's build: cached per Python ABI, torch build and source hash,
and a failed build says so in one line and falls back to the Python collector.
The cache under faults (killed builders, planted or truncated files) is in
tests/test_build_cache.py."""

from __future__ import annotations

import sys
import textwrap

import torch

from opscope.collect.native import build as native_build


def test_build_key_names_torch_version_python_and_hash():
    key = native_build.build_key()
    assert key.startswith("torch" + torch.__version__.replace("+", "_").replace(".", "_"))
    assert f"_{sys.implementation.cache_tag}_" in key
    assert len(key.rsplit("_", 1)[-1]) == 12


def test_native_loads_once_and_is_cached(tmp_path):
    first = native_build.load_native()
    assert first is not None
    assert native_build.load_native() is first
    assert first.RECORD_SIZE == 48
    assert (native_build.cache_dir() / native_build.build_key()).is_dir()
    assert native_build.OBSERVER.library_path().is_file()
    assert first.__file__ == str(native_build.OBSERVER.library_path())


SCRIPT = textwrap.dedent("""
    import torch, opscope
    with opscope.profile() as prof:
        torch.ones(3).add(1)
    print("NAMES", sorted({e.name for e in prof.events()}))
    print("KINETO", opscope.kineto_available())
""")


def run_script(env_extra, tmp_path, warm_python):
    """SCRIPT in a fork of the warm Python (it imports torch first, then opscope afresh)."""
    import os

    env = dict(os.environ)
    env.pop("OPSCOPE_COLLECTOR", None)
    env.update(env_extra)
    env["OPSCOPE_CACHE_DIR"] = str(tmp_path / "cache")
    return warm_python.run(["-c", SCRIPT], env=env, timeout=300)


def test_failed_build_prints_one_line_and_falls_back(tmp_path, warm_python):
    proc = run_script({"OPSCOPE_FORCE_BUILD_FAILURE": "1"}, tmp_path, warm_python)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("opscope:")]
    assert len(lines) == 1
    assert "native collector unavailable" in lines[0]
    assert "Python fallback" in lines[0]
    assert "'aten::add'" in proc.stdout
    assert "KINETO False" in proc.stdout


def test_forcing_native_when_the_build_fails_is_an_error(tmp_path, warm_python):
    proc = run_script({"OPSCOPE_FORCE_BUILD_FAILURE": "1", "OPSCOPE_COLLECTOR": "native"},
                      tmp_path, warm_python)
    assert proc.returncode != 0
    assert "OPSCOPE_COLLECTOR=native" in proc.stderr


def test_bad_collector_name_is_rejected(tmp_path, warm_python):
    proc = run_script({"OPSCOPE_COLLECTOR": "kineto"}, tmp_path, warm_python)
    assert proc.returncode != 0
    assert "OPSCOPE_COLLECTOR must be 'native' or 'python'" in proc.stderr


def test_native_timestamps_are_on_the_monotonic_clock(native_only):
    """Ticks are converted to CLOCK_MONOTONIC ns at stop: ops fall between readings."""
    import time

    import opscope

    with opscope.profile() as prof:
        before = time.monotonic_ns()
        torch.ones(8).add(1)
        after = time.monotonic_ns()
    table = prof.session.table
    names = [table.name(i) for i in range(len(table))]
    i = names.index("aten::add")
    slack = 200_000  # 0.2 ms for the tick-to-ns fit
    assert before - slack <= table.start_ns[i] <= table.end_ns[i] <= after + slack
