"""The module table's memory columns say what they count (issue 27, item 13).

A module's memory there is its forward and backward ops' net bytes, not the op table's
``CPU Mem`` of its range (forward only): the columns are named ``Net CPU Mem`` and the
table, the report and ``--help`` explain the difference.
"""

from __future__ import annotations

from opscope.cli.main import build_parser
from opscope.report.modules import module_view
from test_module_table_golden import model_session


def test_the_report_modules_carry_net_memory_and_its_note():
    view = module_view(model_session())
    assert "net_mem" in view["nodes"][0] and "Net CPU Mem" in view["memory_note"]
    assert "forward only" in view["memory_note"]


def test_table_help_explains_module_memory(capsys):
    import pytest

    with pytest.raises(SystemExit):
        build_parser().parse_args(["table", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Net CPU Mem is that of its forward and backward ops" in text
