"""opscope.export.stacks: collapsed stacks on synthetic sessions with fixed times."""

import gzip
import os
import re

import pytest

from opscope.analysis.collapsed import METRICS, collapsed_stacks
from opscope.export.stacks import stacks_to, write_stacks
from opscope.outputs import FORMATS, get_format
from synthetic import SCOPE_USER, Op, make_session

MODULE = "train.py(3): <module>"
FORWARD = "train.py(5): forward"
LINEAR = "model.py(8): forward"


def step_ops():
    return [
        Op("ProfilerStep#1", 0, 1000, scope=SCOPE_USER, stack=["profiler.py(10): step", MODULE]),
        Op("my forward", 10, 400, scope=SCOPE_USER, stack=[FORWARD, MODULE]),
        Op("aten::linear", 20, 220, stack=[LINEAR, FORWARD, MODULE]),
        Op("aten::addmm", 30, 200),
        Op("aten::linear", 250, 350, stack=[LINEAR, FORWARD, MODULE]),
        Op("aten::addmm", 260, 340),
        Op("aten::tiny", 500, 500.4),  # 0.4 us: its line is left out
        Op("autograd::engine::evaluate_function: MmBackward0", 600, 700),
        Op("worker", 0, 30, thread=1, scope=SCOPE_USER),
        Op("aten::copy_", 5, 25, thread=1),
    ]


# lines in first-seen order (events by start time); values in whole us
EXPECTED = """\
train.py(3):_<module>;profiler.py(10):_step;ProfilerStep#1 509
worker 10
worker;aten::copy_ 20
train.py(3):_<module>;train.py(5):_forward;ProfilerStep#1;my_forward 90
train.py(3):_<module>;train.py(5):_forward;model.py(8):_forward;ProfilerStep#1;my_forward;aten::linear 50
ProfilerStep#1;my_forward;aten::linear;aten::addmm 250
ProfilerStep#1;autograd::engine::evaluate_function:_MmBackward0 100
"""


@pytest.fixture
def session():
    return make_session(step_ops(), thread_ids=(10, 11), options={"with_stack": True})


def test_golden_collapsed_stacks(session, tmp_path):
    write_stacks(session, tmp_path / "s.stacks")
    assert (tmp_path / "s.stacks").read_text() == EXPECTED


def test_every_line_is_frames_a_space_and_a_positive_integer(session, tmp_path):
    write_stacks(session, tmp_path / "s.stacks")
    for line in (tmp_path / "s.stacks").read_text().splitlines():
        assert re.fullmatch(r"[^ ;]+(;[^ ;]+)* [1-9][0-9]*", line), line


def test_identical_paths_are_summed_before_rounding_to_microseconds(tmp_path):
    # two 0.6 us calls on one path: 1 us together, though each alone rounds to 0
    session = make_session([Op("outer", 0, 100, scope=SCOPE_USER), Op("aten::add", 10, 10.6),
                            Op("aten::add", 20, 20.6)])
    write_stacks(session, tmp_path / "s.stacks")
    assert (tmp_path / "s.stacks").read_text() == "outer 98\nouter;aten::add 1\n"


def test_python_frames_are_root_first_and_spaces_become_underscores(tmp_path):
    session = make_session([Op("aten::mm", 0, 5, stack=["inner.py(2): f g", "outer.py(1): <module>"])])
    assert collapsed_stacks(session) == {"outer.py(1):_<module>;inner.py(2):_f_g;aten::mm": 5000}


def test_odd_names_cannot_break_the_format(tmp_path):
    odd = 'a;b c\nd\te "q" \\ 😀'
    session = make_session([Op(odd, 0, 10, stack=["x.py(1): y;z"]), Op("child op", 2, 5)])
    write_stacks(session, tmp_path / "s.stacks")
    lines = (tmp_path / "s.stacks").read_text(encoding="utf-8").splitlines()
    assert lines == ['x.py(1):_y:z;a:b_c_d_e_"q"_\\_😀 7', 'a:b_c_d_e_"q"_\\_😀;child_op 3']


@pytest.mark.parametrize("metric", ["self_cuda_time_total", "self_device_time_total"])
def test_device_metrics_on_a_cpu_session_give_an_empty_file(session, tmp_path, metric):
    write_stacks(session, tmp_path / "s.stacks", metric=metric)
    assert (tmp_path / "s.stacks").read_text() == ""


@pytest.mark.parametrize("metric", ["cpu_time_total", "self_cpu_time", "", None])
def test_unknown_metric_names_the_argument_and_valid_values(session, tmp_path, metric):
    with pytest.raises(ValueError) as info:
        write_stacks(session, tmp_path / "s.stacks", metric=metric)
    message = str(info.value)
    assert "metric" in message and repr(metric) in message
    assert all(valid in message for valid in METRICS)
    assert os.listdir(tmp_path) == []


def test_empty_session_gives_an_empty_file(tmp_path):
    write_stacks(make_session([]), tmp_path / "s.stacks")
    assert (tmp_path / "s.stacks").read_text() == ""


def test_gzip_variant(session, tmp_path):
    write_stacks(session, tmp_path / "s.stacks.gz")
    assert gzip.decompress((tmp_path / "s.stacks.gz").read_bytes()).decode() == EXPECTED


def test_missing_folder_is_named_and_nothing_is_written(session, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        write_stacks(session, tmp_path / "nope" / "s.stacks")
    assert str(tmp_path / "nope") in str(info.value)
    assert os.listdir(tmp_path) == []


def test_registry_entry_writes_stacks(session, tmp_path):
    assert FORMATS["stacks"].write is stacks_to
    get_format("stacks")(session, tmp_path / "r.stacks", metric="self_cpu_time_total")
    assert (tmp_path / "r.stacks").read_text() == EXPECTED
