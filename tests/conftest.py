"""Shared fixtures: no hook may outlive a test; both collectors on demand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def no_hooks_left_installed():
    """After every test: no opscope profiler active, no collector recording, no module hook."""
    yield
    from opscope.api import profiler
    from opscope.record_function import recording_collector

    assert recording_collector() is None, "a collector is still wired to record_function"
    assert profiler._active is None, "an opscope.profile is still marked active"
    from opscope.collect.native.build import _loaded

    if _loaded is not None:
        assert not _loaded.is_recording(), "the native observer is still registered"
    _assert_no_memory_hooks_left()
    from opscope.collect.module_hooks import installed_hooks

    assert not installed_hooks(), "an opscope nn.Module forward hook is still registered"


def _assert_no_memory_hooks_left():
    """profile_memory's hooks (collect/memory_hooks.py) must all be gone."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    from opscope.collect.memory_hooks import TensorSightings
    from opscope.step_tracker import optimizer_listeners

    def ours(hook):
        return isinstance(getattr(hook, "__self__", None), TensorSightings)

    hooks = (list(nn_module._global_forward_pre_hooks.values())
             + list(nn_module._global_forward_hooks.values())
             + list(optim_module._global_optimizer_post_hooks.values())
             + optimizer_listeners())
    assert not any(ours(h) for h in hooks), "a profile_memory hook is still installed"


@pytest.fixture(params=["native", "python"])
def collector_name(request, monkeypatch):
    """Run a test under each collector (OPSCOPE_COLLECTOR)."""
    monkeypatch.setenv("OPSCOPE_COLLECTOR", request.param)
    return request.param


@pytest.fixture
def native_only(monkeypatch):
    monkeypatch.setenv("OPSCOPE_COLLECTOR", "native")


@pytest.fixture(scope="session")
def warm_python():
    """A Python that has imported torch, forked for each ``run`` (tests/warm_python.py): for
    commands that import torch before opscope, as ``python -c "import torch, opscope..."``."""
    from warm_python import WarmPython

    with WarmPython(["torch"]) as warm:
        yield warm


def reference_dir() -> Path:
    """../shared/reference/torch-2.13-cpu beside the repo (CI), else /work/shared."""
    repo = Path(__file__).resolve().parents[1]
    for base in (repo.parent / "shared", Path("/work/shared")):
        candidate = base / "reference" / "torch-2.13-cpu"
        if candidate.is_dir():
            return candidate
    pytest.skip("shared/reference/torch-2.13-cpu not found beside the repo")


# The test files that take longest, longest first (seconds, from a run's --junitxml).
# Under pytest-xdist's --dist loadfile a worker takes a whole file, the next in collection
# order whenever it runs short: these go first, so that no long file is left to run alone
# at the end while the other core has nothing to do. The rest keep their order.
LONGEST_FIRST = (
    "test_bench_smoke.py", "test_black_box_jobs.py", "test_compiled_attribution.py",
    "test_build_cache.py", "test_cli.py", "test_on_demand_startup.py",
    "test_first_contact_cli.py", "test_closed_pipe.py", "test_ranks.py", "test_stragglers.py",
    "test_hostile_input.py", "test_run_distributed.py",
    "test_native_regions.py", "test_clock_sync.py", "test_on_demand.py", "test_store_verbs.py",
    "test_trace_fuzz.py", "test_fork.py", "test_job_store_exit.py", "test_compiled_report.py",
    "test_startup_hook_trust.py", "test_store_trust.py", "test_store_query.py",
    "test_trace_stream.py", "test_on_demand_trust.py", "test_flight_recorder.py",
    "test_on_demand_job.py", "test_report_browser.py", "test_report_ranks.py",
)


def pytest_configure(config):
    os.environ.setdefault("OPSCOPE_QUIET_BUILD", "1")
    # xdist would hand out the files with the most tests first; keep ours (below) instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """Run the files of LONGEST_FIRST first, in its order (a stable sort: the rest after)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
