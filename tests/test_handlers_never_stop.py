"""opscope's ``on_trace_ready`` handlers never stop training (issue 28, "Outputs never stop training").

Twelve real training steps with a schedule (a window every 3 steps) write through
``tensorboard_trace_handler``, ``report_handler`` and ``store_handler`` into a real
full disk (a 64 KiB tmpfs, filled) and into a read-only folder (a tmpfs remounted
read-only as root, a 0500 folder otherwise). All 12 steps run, each handler warns
once, and the last window is still exported elsewhere afterwards. A user's own
``on_trace_ready`` that raises still raises from ``step()``, as torch's does.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings

import pytest
import torch

import opscope
from opscope.cli.results import OUTPUTS, Output, WindowWriter
from subprocesses import fill_disk

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
HANDLERS = {"tensorboard_trace_handler": opscope.tensorboard_trace_handler,
            "report_handler": opscope.report_handler,
            "store_handler": opscope.store_handler}
STEPS = 12


def _mount_tmpfs(folder) -> None:
    """A 64 KiB tmpfs on ``folder`` (root only); skips where it cannot be mounted."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs",
                           str(folder)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


@pytest.fixture
def out_folder(tmp_path):
    """A folder for the handlers' outputs; a tmpfs as root, unmounted afterwards."""
    folder = tmp_path / "out"
    folder.mkdir()
    mounted = False
    if IS_ROOT:
        _mount_tmpfs(folder)
        mounted = True
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=60)
        else:
            os.chmod(folder, 0o700)


def _handlers(folder):
    """Every handler opscope ships, each on its own (existing) folder under ``folder``."""
    made = {}
    for name, make in HANDLERS.items():
        (folder / name).mkdir()
        made[name] = make(str(folder / name))
    return made


def _train(handlers) -> tuple:
    """12 training steps of a small model; every handler gets each ready window."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(8, 16)

    def all_handlers(prof):  # a user's callable: it raises whatever a handler raises
        for handler in handlers.values():
            handler(prof)

    steps = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opscope.profile(schedule=opscope.schedule(wait=1, warmup=1, active=1),
                             on_trace_ready=all_handlers) as prof:
            for _ in range(STEPS):
                model(data).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                prof.step()
                steps += 1
    return prof, steps, [str(w.message) for w in caught if str(w.message).startswith("opscope:")]


def _assert_went_on(prof, steps, messages, folder, error_text, tmp_path) -> None:
    assert steps == STEPS
    for name in HANDLERS:
        mine = [m for m in messages if m.startswith(f"opscope: {name} ")]
        assert len(mine) == 1, (name, messages)  # once, not once per window (4 windows)
        assert repr(str(folder / name)) in mine[0] and error_text in mine[0]
        assert "\n" not in mine[0]
    assert len(messages) == len(HANDLERS), messages
    trace = tmp_path / "elsewhere.pt.trace.json"
    prof.export_chrome_trace(str(trace))  # the last window is kept in memory
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert "ProfilerStep#11" in names and "aten::addmm" in names


def test_full_disk_never_stops_training_and_each_handler_warns_once(out_folder, tmp_path,
                                                                    native_only):
    if not IS_ROOT:
        pytest.skip("a real full disk needs root (a 64 KiB tmpfs)")
    handlers = _handlers(out_folder)
    fill_disk(out_folder)
    prof, steps, messages = _train(handlers)
    _assert_went_on(prof, steps, messages, out_folder, "No space left on device", tmp_path)


def test_read_only_folder_never_stops_training_and_each_handler_warns_once(out_folder, tmp_path,
                                                                           native_only):
    handlers = _handlers(out_folder)
    if IS_ROOT:
        subprocess.run(["mount", "-o", "remount,ro", str(out_folder)], check=True, timeout=60)
        error_text = "Read-only file system"
    else:
        for name in HANDLERS:
            os.chmod(out_folder / name, 0o500)
        error_text = "Permission denied"
    prof, steps, messages = _train(handlers)
    _assert_went_on(prof, steps, messages, out_folder, error_text, tmp_path)


def _steps_before_raise(profile_class, schedule) -> int:
    """Steps completed before a user's raising ``on_trace_ready`` stops the loop."""
    def broken(prof):
        raise ValueError("the user's own handler failed")

    steps = 0
    with pytest.raises(ValueError, match="the user's own handler failed"):
        with profile_class(schedule=schedule(wait=1, warmup=1, active=1),
                           on_trace_ready=broken) as prof:
            for _ in range(STEPS):
                torch.ones(3).add(1)
                prof.step()
                steps += 1
    return steps


def test_a_users_own_raising_handler_raises_from_step_as_in_torch(native_only):
    torch_steps = _steps_before_raise(torch.profiler.profile, torch.profiler.schedule)
    assert _steps_before_raise(opscope.profile, opscope.schedule) == torch_steps == 2


class _BrokenReport(Output):
    """An output whose writer fails with an error that is not an OSError (a bug, say)."""

    def write(self, prof, path):
        raise RuntimeError("the report could not be built")


def test_opscope_runs_window_writer_keeps_any_error_for_its_summary(tmp_path, native_only):
    """``opscope run``'s on_trace_ready: every window's error is kept, none reaches step()."""
    writer = WindowWriter(str(tmp_path), "out", "train", by_step=True,
                          outputs=OUTPUTS + [_BrokenReport("report", "report", ".html")])
    prof, steps, messages = _train({"writer": writer})
    assert steps == STEPS and messages == []
    assert len(writer.errors) == 4 and all("the report could not be built" in e
                                           for e in writer.errors)
    assert sorted(os.listdir(tmp_path)) == [f"train.step{n}.pt.trace.json" for n in (11, 2, 5, 8)]
