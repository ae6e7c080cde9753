"""Nothing recorded is lost: a second start(), a failing output or export keeps the session.

After each fault: the recording is intact (key_averages works), no hook is left
installed (the autouse fixture in conftest.py checks), and a new profile starts.
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch

import opscope


def names_of(prof):
    return {row.key for row in prof.key_averages()}


def assert_a_new_profile_starts():
    with opscope.profile() as again:
        torch.ones(3).mul(2)
    assert "aten::mul" in names_of(again)


def test_start_twice_raises_and_recording_goes_on(collector_name):
    prof = opscope.profile()
    prof.start()
    try:
        torch.ones(2).add(1)
        with pytest.raises(RuntimeError, match="already running"):
            prof.start()
        torch.ones(2).mul(3)  # after the refused start: still recorded
    finally:
        prof.stop()
    names = names_of(prof)
    assert {"aten::add", "aten::mul"} <= names
    assert_a_new_profile_starts()


def test_start_twice_in_with_block(native_only):
    with opscope.profile() as prof:
        torch.ones(2).add(1)
        with pytest.raises(RuntimeError, match="already running"):
            prof.start()
        torch.ones(2).mul(3)
    assert {"aten::add", "aten::mul"} <= names_of(prof)


def test_stop_twice_is_harmless(native_only):
    calls = []
    prof = opscope.profile(on_trace_ready=calls.append)
    prof.start()
    torch.ones(2).add(1)
    prof.stop()
    prof.stop()
    assert len(calls) == 1
    assert "aten::add" in names_of(prof)


class _FailingEtWriter:
    """Stands for the ET observer's writer on a full disk."""

    def __init__(self, real):
        self.real = real

    def write_nodes(self, nodes):
        raise OSError(errno.ENOSPC, "No space left on device", "et.json")

    def __getattr__(self, name):
        return getattr(self.real, name)


def _failing_et(tmp_path):
    et = opscope.ExecutionTraceObserver().register_callback(str(tmp_path / "et.json"))
    et._writer = _FailingEtWriter(et._writer)
    return et


def test_execution_trace_full_disk_keeps_session(native_only, tmp_path):
    et = _failing_et(tmp_path)
    try:
        with pytest.raises(OSError) as info:
            with opscope.profile(execution_trace_observer=et) as prof:
                torch.ones(2).add(1)
        assert info.value.errno == errno.ENOSPC
        assert "aten::add" in names_of(prof)
        prof.export_chrome_trace(str(tmp_path / "trace.json"))
        assert (tmp_path / "trace.json").stat().st_size > 0
    finally:
        try:
            et.unregister_callback()
        except OSError:
            pass
    assert not et.is_registered
    assert_a_new_profile_starts()


def _tiny_tmpfs(path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                          capture_output=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


def test_execution_trace_on_real_full_disk_keeps_session(native_only, tmp_path):
    full = tmp_path / "full"
    _tiny_tmpfs(full)
    try:
        (full / "filler").write_bytes(b"\0" * 60_000)
        et = opscope.ExecutionTraceObserver().register_callback(str(full / "et.json"))
        with pytest.raises(OSError):
            try:
                with opscope.profile(execution_trace_observer=et) as prof:
                    x = torch.ones(64, 64)
                    for _ in range(300):
                        x = x.add(1).mul(1.0).relu()
            finally:
                assert not et.is_registered
        assert "aten::add" in names_of(prof)
        assert_a_new_profile_starts()
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True, timeout=30)


def test_on_trace_ready_raising_keeps_session(collector_name):
    def broken(prof):
        raise ValueError("handler broke")

    with pytest.raises(ValueError, match="handler broke"):
        with opscope.profile(on_trace_ready=broken) as prof:
            torch.ones(2).add(1)
    assert "aten::add" in names_of(prof)
    assert prof.events()
    assert_a_new_profile_starts()


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_on_trace_ready_raising_in_a_cycle_keeps_it_and_goes_on(native_only):
    sessions = []

    def flaky(prof):
        sessions.append(prof.session)
        if len(sessions) == 1:
            raise ValueError("first cycle's handler broke")

    sched = opscope.schedule(wait=0, warmup=0, active=1, repeat=3)
    ops = [torch.add, torch.mul, torch.sub]
    with opscope.profile(schedule=sched, on_trace_ready=flaky) as prof:
        for i, op in enumerate(ops):
            op(torch.ones(2), 1)
            if i == 0:
                with pytest.raises(ValueError, match="first cycle"):
                    prof.step()
                assert "aten::add" in names_of(prof)
                assert "ProfilerStep*" in names_of(prof)
            else:
                prof.step()
    assert len(sessions) == 3
    for session, name in zip(sessions, ["aten::add", "aten::mul", "aten::sub"]):
        recorded = {session.table.name(i) for i in range(len(session.table))}
        assert name in recorded
    assert_a_new_profile_starts()


def test_failing_export_keeps_session(collector_name, tmp_path, monkeypatch):
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    import dataclasses

    from opscope.outputs import FORMATS

    def full_disk(session, out, path):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    # every export goes through the registry of formats: break its chrome trace entry
    monkeypatch.setitem(FORMATS, "chrome_trace",
                        dataclasses.replace(FORMATS["chrome_trace"], write=full_disk))
    with pytest.raises(OSError):
        prof.export_chrome_trace(str(tmp_path / "trace.json"))
    monkeypatch.undo()
    assert "aten::add" in names_of(prof)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert (tmp_path / "trace.json").stat().st_size > 0
    with pytest.raises(OSError):
        prof.export_stacks(str(tmp_path / "missing" / "stacks.txt"))
    assert "aten::add" in names_of(prof)
    assert_a_new_profile_starts()
