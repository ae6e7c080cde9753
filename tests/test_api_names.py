"""Every public name of the installed ``torch.profiler`` exists in opscope.

The names come from the torch that is installed, so the same test checks torch 2.4's
API on 2.4 and 2.15's on 2.15 (bench/compat.py runs it on every supported pair).
"""

from __future__ import annotations

import pytest
import torch.profiler

import opscope


@pytest.mark.parametrize("name", sorted(torch.profiler.__all__))
def test_torch_profiler_name_exists_in_opscope(name):
    assert hasattr(opscope, name), f"opscope has no {name!r} (torch.profiler.{name} exists)"
    assert name in opscope.__all__, f"{name!r} is missing from opscope.__all__"
