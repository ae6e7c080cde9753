"""torch 2.15's API on every torch: ProfilerActivityConfig, the dict form of
``activities``, the extension configs, and ``key_averages(include_python_functions=)``.

Where the installed torch has these classes (2.15+), the tests also check that
opscope's match them field for field and that torch's own instances are accepted.
"""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import json
import warnings

import pytest
import torch
import torch.profiler

import opscope
from opscope import (
    CuspyConfig, PerformanceMetricsConfig, ProfilerActivity, ProfilerActivityConfig,
)
from opscope.activity import resolve_activity_configs
from opscope.analysis.aggregate import session_key_averages
from opscope.analysis.build import load_session
from opscope.load import TraceLoadError
from opscope.configs import CONFIGS_METADATA_KEY
from opscope.event_list import EventList
from opscope.model.function_event import FunctionEvent

CPU, CUDA = ProfilerActivity.CPU, ProfilerActivity.CUDA
CONFIG_NAMES = ("ProfilerActivityConfig", "CuspyConfig", "PerformanceMetricsConfig")
TORCH_HAS_CONFIGS = hasattr(torch.profiler, "ProfilerActivityConfig")
# torch.profiler's key_averages gained include_python_functions in 2.15 (asked, not assumed)
TORCH_HAS_PY_FLAG = "include_python_functions" in inspect.signature(
    torch.autograd.profiler_util.EventList.key_averages).parameters
needs_torch_configs = pytest.mark.skipif(not TORCH_HAS_CONFIGS,
                                         reason="this torch has no ProfilerActivityConfig")


def _work():
    return torch.ones(8, 8) @ torch.ones(8, 8) + 1


def _op_counts(prof):
    return {row.key: row.count for row in prof.key_averages() if row.key.startswith("aten::")}


def _recorded(activities, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CUDA not recordable here
        with opscope.profile(activities=activities, **kwargs) as prof:
            _work()
    return prof


# -- the classes --------------------------------------------------------------------------

@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_class_is_public(name):
    assert name in opscope.__all__
    assert dataclasses.is_dataclass(getattr(opscope, name))


@needs_torch_configs
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_fields_match_torch(name):
    ours = {(f.name, f.default) for f in dataclasses.fields(getattr(opscope, name))}
    theirs = {(f.name, f.default) for f in dataclasses.fields(getattr(torch.profiler, name))}
    assert ours == theirs


def test_performance_metrics_entries_and_lookup():
    pm = PerformanceMetricsConfig(["a"], lookback_window_ms=5.0)
    assert pm._to_config_entries() == {"PERFORMANCE_METRICS": "a",
                                       "PERFORMANCE_METRICS_LOOKBACK_WINDOW_MS": "5.0"}
    cfg = ProfilerActivityConfig(profiler_configs=[CuspyConfig(), pm])
    assert cfg._get_profiler_config(PerformanceMetricsConfig) is pm
    with pytest.raises(dataclasses.FrozenInstanceError):
        CuspyConfig().enable_cuda_sync_events = True  # frozen, as torch's


# -- the dict form of activities ----------------------------------------------------------

@pytest.mark.parametrize("activities", [
    [{CPU: ProfilerActivityConfig()}],
    [{CPU: None}],
    [{CPU: ProfilerActivityConfig()}, {}],
    ({CPU: ProfilerActivityConfig(profiler_configs=[])},),
], ids=["config", "none", "with-empty-dict", "tuple"])
def test_dict_form_records_as_the_bare_activity(activities):
    assert _op_counts(_recorded(activities)) == _op_counts(_recorded([CPU]))


def test_dict_form_keeps_configs_per_activity():
    cuda_cfg = ProfilerActivityConfig(profiler_configs=[CuspyConfig()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CUDA not recordable here
        wanted, configs = resolve_activity_configs([CPU, {CUDA: cuda_cfg}])
    assert CPU in wanted and configs == {CUDA: cuda_cfg}
    wanted, configs = resolve_activity_configs([{CPU: ["cpu_op"]}])
    assert wanted == {CPU} and configs[CPU].activity_types == ["cpu_op"]
    prof = _recorded([{CPU: None}, {CUDA: cuda_cfg}])
    assert prof.activity_configs[CUDA] is cuda_cfg


@needs_torch_configs
def test_torch_config_instances_are_accepted():
    tp = torch.profiler
    cfg = tp.ProfilerActivityConfig(profiler_configs=[tp.CuspyConfig(),
                                                      tp.PerformanceMetricsConfig(["m"])])
    prof = _recorded([{CPU: tp.ProfilerActivityConfig()}, {CUDA: cfg}])
    kept = json.loads(prof.session.metadata[CONFIGS_METADATA_KEY])
    assert [c["type"] for c in kept["CUDA"]["profiler_configs"]] == [
        "CuspyConfig", "PerformanceMetricsConfig"]
    assert _op_counts(prof) == _op_counts(_recorded([CPU]))


@pytest.mark.parametrize("activities, error, words", [
    ([{"CPU": None}], TypeError, ["dict's keys must be ProfilerActivity", "str 'CPU'"]),
    ([{CPU: 5}], TypeError, ["activities[ProfilerActivity.CPU] must be a ProfilerActivityConfig",
                             "int 5"]),
    ([{CPU: "cpu_op"}], TypeError, ["activities[ProfilerActivity.CPU]", "str 'cpu_op'"]),
    ([{CPU: ProfilerActivityConfig(activity_types="cpu_op")}], TypeError,
     ["activity_types must be a list of str or None"]),
    ([{CPU: [1]}], TypeError, ["activity_types must hold only str", "int 1"]),
    ([{CPU: ProfilerActivityConfig(profiler_configs=["x"])}], TypeError,
     ["profiler_configs must hold CuspyConfig or PerformanceMetricsConfig", "str 'x'"]),
    ([{CPU: ProfilerActivityConfig(profiler_configs=CuspyConfig())}], TypeError,
     ["profiler_configs must be a list"]),
    ([CPU, {CPU: None}], ValueError, ["ProfilerActivity.CPU specified more than once"]),
    ([{CPU: None}, CPU], ValueError, ["ProfilerActivity.CPU specified more than once"]),
    ([{CUDA: ProfilerActivityConfig(profiler_configs=[CuspyConfig()])}], ValueError,
     ["CuspyConfig needs ProfilerActivity.CPU"]),
    ([3], TypeError, ["activities must be an iterable of ProfilerActivity or", "int 3"]),
])
def test_bad_dict_form_names_activities(activities, error, words):
    with pytest.raises(error) as caught:
        opscope.profile(activities=activities)
    message = str(caught.value)
    assert message.startswith("profile: activities")
    for word in words:
        assert word in message


def test_repeated_bare_activity_is_still_fine():
    assert _op_counts(_recorded([CPU, CPU])) == _op_counts(_recorded([CPU]))


# -- configs in the trace metadata --------------------------------------------------------

def _trace_metadata(prof, tmp_path):
    path = tmp_path / "trace.json.gz"
    prof.export_chrome_trace(str(path))
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_device_configs_are_kept_in_the_trace(tmp_path):
    pm = PerformanceMetricsConfig(["sm__active"], sampling_interval_ms=2.0)
    prof = _recorded([CPU, {CUDA: ProfilerActivityConfig(activity_types=["kernel"],
                                                         profiler_configs=[CuspyConfig(), pm])}])
    doc = _trace_metadata(prof, tmp_path)
    kept = doc[CONFIGS_METADATA_KEY]
    kept = json.loads(kept) if isinstance(kept, str) else kept
    assert kept["CUDA"]["activity_types"] == ["kernel"]
    assert kept["CUDA"]["profiler_configs"][1] == {
        "type": "PerformanceMetricsConfig", "metric_names": ["sm__active"],
        "sampling_interval_ms": 2.0, "lookback_window_ms": None}
    assert "CPU" not in kept


def test_default_configs_leave_no_metadata(tmp_path):
    prof = _recorded([{CPU: ProfilerActivityConfig()}, {CUDA: None}])
    assert CONFIGS_METADATA_KEY not in _trace_metadata(prof, tmp_path)


def test_cpu_activity_types_warn_and_are_kept():
    with pytest.warns(RuntimeWarning, match=r"records every CPU event.*\['cpu_op'\]"):
        prof = opscope.profile(activities=[{CPU: ["cpu_op"]}])
    with prof:
        _work()
    assert json.loads(prof.session.metadata[CONFIGS_METADATA_KEY]) == {
        "CPU": {"activity_types": ["cpu_op"], "profiler_configs": []}}
    assert _op_counts(prof) == _op_counts(_recorded([CPU]))


# -- key_averages(include_python_functions=) ----------------------------------------------

def _event(eid, name, start, end, python=False):
    ev = FunctionEvent(id=eid, name=name, thread=1, start_us=start, end_us=end)
    ev.is_python_function = python
    return ev


def test_event_list_leaves_python_functions_out_by_default():
    events = EventList([_event(1, "train.py(3): step", 0, 10, python=True),
                        _event(2, "aten::add", 1, 3), _event(3, "aten::add", 4, 6)])
    assert [(r.key, r.count) for r in events.key_averages()] == [("aten::add", 2)]
    rows = events.key_averages(include_python_functions=True)
    assert [r.key for r in rows] == ["train.py(3): step", "aten::add"]


def test_profile_key_averages_accepts_the_flag_positionally_as_torch():
    prof = _recorded([CPU])
    plain = [(r.key, r.count) for r in prof.key_averages()]
    # torch's order: group_by_input_shape, group_by_stack_n, group_by_overload_name, include_...
    assert [(r.key, r.count) for r in prof.key_averages(False, 0, False, True)] == plain
    assert [(r.key, r.count) for r in prof.key_averages(
        group_by_overload_name=True, include_python_functions=True)]
    with pytest.raises(TypeError, match=r"^key_averages: include_python_functions must be"):
        prof.key_averages(include_python_functions="yes")


def test_loaded_torch_trace_follows_torch_rule_for_python_functions(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())

    def step():
        model(torch.ones(4, 8)).sum().backward()

    step()
    with torch.profiler.profile(with_stack=True) as tprof:
        step()
    path = str(tmp_path / "torch.json")
    tprof.export_chrome_trace(path)
    try:
        loaded = load_session(path)
    except TraceLoadError as e:
        # torch 2.4 can write python_function names with invalid UTF-8 bytes; whether
        # such a trace loads is the trace loader's business, not this test's
        pytest.skip(f"this torch's with_stack trace does not load: {e}")

    def keys(rows):
        return {(r.key, r.count) for r in rows}

    # "counted" keeps every python_function event as a marked row, so the flag can choose
    counted = load_session(path, python_functions="counted")
    without = keys(session_key_averages(counted, include_python_functions=False))
    with_all = keys(session_key_averages(counted, include_python_functions=True))
    assert without <= with_all and any(key.startswith("aten::") for key, _ in without)
    marks = counted.python_function_rows
    python_names = set()
    if marks is not None and marks.any():
        python_names = {counted.table.symbols[int(i)] for i in counted.table.name_id[marks]}
    assert not {key for key, _ in without} & python_names
    if TORCH_HAS_PY_FLAG:  # torch 2.15+: the flag means the same in both
        assert without == keys(tprof.key_averages())
        assert with_all == keys(tprof.key_averages(include_python_functions=True))
        # by default a loaded trace follows the rule of the torch that wrote it
        assert keys(session_key_averages(loaded)) == without
    else:  # torch drops python_function events from events() (2.4, 2.8) or counts them (2.13)
        assert without == {k for k in keys(tprof.key_averages()) if k[0] not in python_names}
