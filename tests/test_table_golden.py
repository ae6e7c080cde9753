"""Golden tests for ``opscope.export.table``.

Two kinds of expected text:

- tables printed by the real torch.profiler 2.13, under ``shared/reference/torch-2.13-cpu``.
  The rows that reproduce them live in ``tests/golden/rows_*.json``: every number was read
  off the printed table, and the ``pad::filler_NN`` rows (sorted below the row limit) carry
  the rest of the self CPU time, so each printed percentage and the footer come out equal.
- our own goldens, ``tests/golden/*.txt``, for cases the references do not cover. They are
  rewritten only when ``OPSCOPE_UPDATE_GOLDEN=1`` is set; otherwise they are compared.

Everything is synthetic: no profiler runs and no time is measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from torch.autograd import DeviceType

from opscope.export.table import (format_memory, format_table, format_time,
                                  format_time_share, valid_sort_keys)
from opscope.model.function_event import FunctionEventAvg

REPO_ROOT = Path(__file__).resolve().parents[1]
from golden_files import GOLDEN, check_golden  # noqa: E402


def _reference_dir():
    for shared in (REPO_ROOT.parent / "shared", Path("/work/shared")):
        folder = shared / "reference" / "torch-2.13-cpu"
        if folder.is_dir():
            return folder
    return None


REFERENCE = _reference_dir()
needs_reference = pytest.mark.skipif(
    REFERENCE is None,
    reason="torch 2.13 reference tables not found at ../shared/reference/torch-2.13-cpu "
           "(relative to the repo root) nor /work/shared/reference/torch-2.13-cpu")


def reference(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


def load_rows(name: str):
    """FunctionEventAvg rows from a fixture; ``nested`` rows get a non-None cpu_parent."""
    data = json.loads((GOLDEN / name).read_text(encoding="utf-8"))
    parent = FunctionEventAvg("fixture parent")
    rows = []
    for spec in data["rows"]:
        spec = dict(spec)
        nested = spec.pop("nested", False)
        row = FunctionEventAvg(**spec)
        if nested:
            row.cpu_parent = parent
        rows.append(row)
    return data, rows


def row(key, self_us, total_us, count=1, **fields):
    return FunctionEventAvg(key, count=count, self_cpu_time_total=self_us,
                            cpu_time_total=total_us, **fields)


# A 2.5 s step, so the automatic unit varies by row: s, ms and us.
SMALL_ROWS = [row("train_step", 500.25, 2_012_503.5),
              row("aten::linear", 12_000.0, 2_012_003.25, count=2),
              row("aten::addmm", 2_000_000.0, 2_000_000.0, count=2),
              row("aten::t", 3.25, 3.25, count=4)]


# --- fixtures are consistent with themselves ---------------------------------------

@pytest.mark.parametrize("name", ["rows_key_averages.json", "rows_ops_only.json",
                                  "rows_by_input_shape.json", "rows_verbose_by_stack3.json",
                                  "rows_overload.json"])
def test_fixture_rows_sum_to_their_stated_total(name):
    data, rows = load_rows(name)
    total = sum(r.self_cpu_time_total for r in rows)
    assert total == pytest.approx(data["total_self_cpu_us"], abs=1e-6)


# --- torch 2.13 reference tables, character for character --------------------------

# (reference file, row fixture, format_table options). table_verbose_by_stack3 (stacks
# and FLOPs) has torch's bug: the FLOPs value printed under "Source Location"; opscope
# puts the FLOPs column before the source column instead (test below).
REFERENCE_TABLES = [
    ("table_key_averages.txt", "rows_key_averages.json",
     dict(sort_by="self_cpu_time_total", row_limit=25)),
    ("table_by_stack3.txt", "rows_key_averages.json",
     dict(sort_by="self_cpu_time_total", row_limit=8)),
    ("table_ops_only_key_averages.txt", "rows_ops_only.json",
     dict(sort_by="self_cpu_time_total", row_limit=40)),
    ("table_by_input_shape.txt", "rows_by_input_shape.json",
     dict(sort_by="cpu_time_total", row_limit=20)),
    ("table_events_toplevel.txt", "rows_by_input_shape.json",
     dict(sort_by="cpu_time_total", row_limit=20, top_level_events_only=True)),
]


@needs_reference
@pytest.mark.parametrize("reference_name, fixture, options", REFERENCE_TABLES,
                         ids=[r[0] for r in REFERENCE_TABLES])
def test_reference_table_matches_torch(reference_name, fixture, options):
    _, rows = load_rows(fixture)
    text = format_table(rows, profile_memory=True, with_flops=True, **options)
    assert text == reference(reference_name)


def _tail_cells(line: str, start: int) -> list:
    return [c for c in re.split(r"\s{2,}", line[start:].strip()) if c]


@needs_reference
def test_stack_table_with_flops_fixes_torchs_swapped_columns():
    """torch 2.13 titles "Source Location" before "Total MFLOPs" but fills the FLOPs cell
    first, and its further frames land under the FLOPs title. opscope titles the FLOPs
    column first and keeps the source column last; every other cell equals torch's."""
    _, rows = load_rows("rows_verbose_by_stack3.json")
    ours = format_table(rows, profile_memory=True, with_flops=True,
                        sort_by="self_cpu_time_total", row_limit=8).split("\n")
    torch_lines = reference("table_verbose_by_stack3.txt").split("\n")
    assert len(ours) == len(torch_lines)
    cut = torch_lines[1].index("# of Calls") + len("# of Calls")
    assert _tail_cells(torch_lines[1], cut) == ["Source Location", "Total MFLOPs"]
    assert _tail_cells(ours[1], cut) == ["Total MFLOPs", "Source Location"]
    source_at = ours[1].index("Source Location")
    for mine, theirs in zip(ours[3:], torch_lines[3:]):
        assert mine[:cut] == theirs[:cut]
        if not set(theirs.strip()) <= {"-", " "}:  # separator lines differ in order only
            assert _tail_cells(mine, cut) == _tail_cells(theirs, cut)
        frame = _tail_cells(mine, cut)
        if mine[:cut].strip() == "" and frame:  # a further frame: under the source title
            assert mine.index(frame[0]) == source_at


@needs_reference
def test_overload_tables_match_torch():
    _, rows = load_rows("rows_overload.json")
    with_names = format_table(rows, with_overload_name=True)
    without_names = format_table(rows, with_overload_name=False)
    # the reference holds print(first); print(second)
    assert with_names + "\n" + without_names + "\n" == reference("overload_table.txt")


# --- our own goldens ----------------------------------------------------------------

@pytest.mark.parametrize("unit", [None, "s", "ms", "us"])
def test_time_unit(unit):
    check_golden(f"table_time_unit_{unit or 'auto'}.txt",
                 format_table(SMALL_ROWS, sort_by="cpu_time_total", time_unit=unit))


def test_zero_total_prints_nan():
    rows = [row("a", 0.0, 0.0), row("b", 2.0, 5.0), row("c", -2.0, 3.0)]
    check_golden("table_nan_total.txt", format_table(rows))


def test_long_names_stacks_and_shapes_are_cut():
    # like torch, a name of exactly width - 3 characters already gets "..."
    rows = [
        row("n" * 16, 3.0, 3.0, input_shapes=[[1, 2]], stack=["short.py(1): f"]),
        row("x" * 17, 2.0, 2.0, input_shapes=[[1024, 1024]] * 12,
            stack=["a/very/long/path/" * 6 + "module.py(10): forward", "top.py(3): <module>"]),
        row("y" * 80, 1.0, 1.0, input_shapes=[]),
    ]
    text = format_table(rows, max_name_column_width=20, max_src_column_width=30,
                        max_shapes_column_width=25)
    check_golden("table_long_names.txt", text)


def test_header_with_top_level_only():
    top = row("train_step", 4.0, 10.0)
    child = row("aten::mm", 6.0, 6.0)
    child.cpu_parent = top
    check_golden("table_header_top_level.txt",
                 format_table([child, top], header="STEP 3", top_level_events_only=True))


def test_device_columns_node_id_and_async():
    cpu_op = row("aten::mm", 30.0, 30.0, count=2, node_id=0)
    kernel = row("gemm_kernel", 0.0, 0.0, count=2, node_id=0)
    annotation = row("my_range", 10.0, 40.0, node_id=1)
    gpu_annotation = row("my_range", 0.0, 0.0, node_id=1, is_user_annotation=True)
    annotation.is_async = True
    for device_row in (kernel, gpu_annotation):
        device_row.device_type = DeviceType.CUDA
        device_row.self_device_time_total = device_row.device_time_total = 20.0
    # CPU ops and GPU user annotations repeat kernel time: both stay out of the device total
    cpu_op.self_device_time_total = cpu_op.device_time_total = 20.0
    kernel.self_device_memory_usage = kernel.device_memory_usage = 4096
    rows = [cpu_op, kernel, annotation, gpu_annotation]
    for r in rows:
        r.use_device = "cuda"
    text = format_table(rows, sort_by="self_cuda_time_total", profile_memory=True)
    check_golden("table_device.txt", text)


def test_sort_by_error_lists_valid_keys():
    with pytest.raises(ValueError) as info:
        format_table(SMALL_ROWS, sort_by="self_cpu_time")
    check_golden("sort_by_error.txt", str(info.value) + "\n")


# --- behaviour --------------------------------------------------------------------

def names_in(text):
    return [line.split()[0] for line in text.splitlines()[3:-2]]


def test_rows_keep_given_order_without_sort_by():
    assert names_in(format_table(SMALL_ROWS[::-1])) == ["aten::t", "aten::addmm", "aten::linear",
                                                         "train_step"]


def test_sort_by_is_descending_and_stable():
    rows = [row("a", 1.0, 1.0, count=3), row("b", 1.0, 1.0, count=5), row("c", 1.0, 1.0, count=3)]
    assert names_in(format_table(rows, sort_by="count")) == ["b", "a", "c"]


def test_device_aliases_sort_on_device_attributes():
    rows = [row("a", 1.0, 1.0), row("b", 1.0, 1.0)]
    rows[1].device_time_total = 5.0
    for alias in ("cuda_time_total", "xpu_time_total", "privateuse1_time_total"):
        assert names_in(format_table(rows, sort_by=alias)) == ["b", "a"]


def test_percentages_count_rows_past_the_limit():
    rows = [row("a", 30.0, 30.0), row("b", 10.0, 10.0)]
    text = format_table(rows, row_limit=1)
    assert names_in(text) == ["a"]
    assert "75.00%" in text and text.endswith("Self CPU time total: 40.000us\n")


def test_row_limit_minus_one_shows_all_and_zero_shows_none():
    assert len(names_in(format_table(SMALL_ROWS, row_limit=-1))) == 4
    assert len(names_in(format_table(SMALL_ROWS, row_limit=2))) == 2
    assert names_in(format_table(SMALL_ROWS, row_limit=0)) == []


def test_flops_header_scales_from_smallest_count():
    rows = [row("a", 1.0, 1.0, flops=5_000_000), row("b", 1.0, 1.0, flops=2_500),
            row("c", 1.0, 1.0)]
    text = format_table(rows, with_flops=True)
    assert "Total KFLOPs" in text and "5000.000" in text and "   2.500" in text
    assert "FLOPs" not in format_table(rows[2:], with_flops=True)


def test_overload_column_needs_flag_and_a_name():
    rows = [row("aten::add", 1.0, 1.0, overload_name="Tensor")]
    assert "Overload Name" in format_table(rows, with_overload_name=True)
    assert "Overload Name" not in format_table(rows)
    assert "Overload Name" not in format_table([row("a", 1.0, 1.0)], with_overload_name=True)


def test_memory_columns_only_with_profile_memory():
    rows = [row("a", 1.0, 1.0, cpu_memory_usage=2048)]
    assert "2.00 KB" in format_table(rows, profile_memory=True)
    assert "CPU Mem" not in format_table(rows)


def test_bad_time_unit_names_the_argument():
    with pytest.raises(ValueError, match="time_unit"):
        format_table(SMALL_ROWS, time_unit="min")


def test_device_time_without_use_device_is_an_error():
    rows = [row("a", 1.0, 1.0)]
    rows[0].self_device_time_total = 2.0
    with pytest.raises(RuntimeError, match="use_device"):
        format_table(rows)


def test_no_rows_gives_empty_text():
    assert format_table([]) == ""


def test_valid_sort_keys_cover_torch_names():
    for key in ("cpu_time", "cuda_time", "xpu_time", "cpu_time_total", "cuda_time_total",
                "self_cpu_time_total", "self_cuda_time_total", "cpu_memory_usage",
                "self_xpu_memory_usage", "count", "flops"):
        assert key in valid_sort_keys()


# --- unit formatters ----------------------------------------------------------------

@pytest.mark.parametrize("time_us, unit, expected", [
    (0.0, None, "0.000us"), (999.9994, None, "999.999us"), (1000.0, None, "1.000ms"),
    (1972.525, None, "1.973ms"), (999_999.0, None, "999.999ms"), (1_000_000.0, None, "1.000s"),
    (-32.473, None, "-32.473us"), (-5000.0, None, "-5000.000us"),
    (1972.525, "us", "1972.525us"), (125.044, "ms", "0.125ms"), (125.044, "s", "0.000s"),
])
def test_format_time(time_us, unit, expected):
    assert format_time(time_us, unit) == expected


@pytest.mark.parametrize("nbytes, expected", [
    (0, "0 B"), (-32, "-32 B"), (1023, "1023 B"), (1024, "1.00 KB"), (-38441, "-37.54 KB"),
    (108544, "106.00 KB"), (1024 ** 2, "1.00 MB"), (int(1.5 * 1024 ** 3), "1.50 GB"),
    (-5 * 1024 ** 3, "-5.00 GB"), (2048 * 1024 ** 3, "2048.00 GB"),
])
def test_format_memory(nbytes, expected):
    assert format_memory(nbytes) == expected


@pytest.mark.parametrize("time_us, total_us, expected", [
    (125.044, 1972.525, "6.34%"), (1972.525, 1972.525, "100.00%"), (-32.473, 1972.525, "-1.65%"),
    (0.0, 5.0, "0.00%"), (0.0, 0.0, "NaN"), (3.0, 0.0, "NaN"),
])
def test_format_time_share(time_us, total_us, expected):
    assert format_time_share(time_us, total_us) == expected
