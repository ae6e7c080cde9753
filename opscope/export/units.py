"""Times, shares, bytes and FLOPs as torch.profiler's text tables write them.

The summary table (``export/table.py``), the module table, the memory summary and
the diffs all format their cells with these, so their units agree.

>>> format_time(1642.58), format_memory(3 * 1024 ** 3), format_time_share(1.0, 4.0)
('1.643ms', '3.00 GB', '25.00%')
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

US_PER_UNIT = {"s": 1_000_000.0, "ms": 1_000.0, "us": 1.0}
BYTES_PER_UNIT = (("GB", 1024 ** 3), ("MB", 1024 ** 2), ("KB", 1024))
FLOPS_HEADERS = ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs")
FLOP_RATE_UNITS = ("FLOP/s", "KFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s")


def micros_text(ns: int) -> str:
    """Nanoseconds as a JSON number of microseconds with three decimals (exact).

    >>> micros_text(1_234_567), micros_text(5), micros_text(-1_500)
    ('1234.567', '0.005', '-1.500')
    """
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(int(ns)), 1000)
    return f"{sign}{q}.{r:03d}"


def format_time(time_us: float, unit: Optional[str] = None) -> str:
    """Microseconds as text with 3 decimals, in ``unit`` or the largest unit reached.

    >>> format_time(125.0444), format_time(1642.58), format_time(2.5e6), format_time(5.0, "ms")
    ('125.044us', '1.643ms', '2.500s', '0.005ms')
    """
    if unit is None:
        unit = "s" if time_us >= US_PER_UNIT["s"] else "ms" if time_us >= US_PER_UNIT["ms"] else "us"
    if unit not in US_PER_UNIT:
        raise ValueError(f"time_unit must be one of None, 's', 'ms', 'us'; got {unit!r}")
    return f"{time_us / US_PER_UNIT[unit]:.3f}{unit}"


def format_time_share(time_us: float, total_us: float) -> str:
    """``time_us`` as a percentage of ``total_us``; ``"NaN"`` when the total is zero.

    >>> format_time_share(125.044, 1972.525), format_time_share(-32.473, 1972.525)
    ('6.34%', '-1.65%')
    >>> format_time_share(0.0, 0.0)
    'NaN'
    """
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def format_memory(nbytes: int) -> str:
    """Bytes as text in base-1024 units, two decimals above 1 KB.

    >>> format_memory(0), format_memory(-38440), format_memory(3 * 1024 ** 3)
    ('0 B', '-37.54 KB', '3.00 GB')
    """
    for unit, size in BYTES_PER_UNIT:
        if abs(nbytes) >= size:
            return f"{nbytes * 1.0 / size:.2f} {unit}"
    return f"{nbytes} B"


def row_value(evt, name: str, default=0):
    """``evt.name``, or ``default`` when the row lacks it or holds None.

    >>> from types import SimpleNamespace
    >>> row_value(SimpleNamespace(flops=None), "flops"), row_value(object(), "count", 1)
    (0, 1)
    """
    value = getattr(evt, name, default)
    return default if value is None else value


def flops_scale(values, units: Sequence[str] = FLOPS_HEADERS, *,
                from_largest: bool = False) -> Optional[Tuple[float, str]]:
    """(multiplier, unit) for FLOP counts, picked as torch does from the smallest positive.

    ``from_largest`` picks it from the largest instead, so the largest value
    reads below 1000 (opscope's module table, whose root holds the model's total).

    >>> flops_scale([2_500, 5_000_000, 0])
    (0.001, 'KFLOPs')
    >>> flops_scale([2_500, 5_000_000, 0], from_largest=True)
    (1e-06, 'MFLOPs')
    >>> flops_scale([3e9], FLOP_RATE_UNITS), flops_scale([0])
    ((1e-09, 'GFLOP/s'), None)
    """
    positive = [v for v in values if v > 0]
    if not positive:
        return None
    pick = max(positive) if from_largest else min(positive)
    level = int(max(0.0, min(math.log10(pick) / 3, len(units) - 1.0)))
    return pow(10, level * -3.0), units[level]


def flop_rate(evt) -> float:
    """Achieved FLOP/s of a row: its FLOPs over its CPU total time (0 without either).

    >>> from opscope.model.function_event import FunctionEventAvg
    >>> flop_rate(FunctionEventAvg("aten::mm", cpu_time_total=2.0, flops=4_000))
    2000000000.0
    """
    seconds = row_value(evt, "cpu_time_total") / US_PER_UNIT["s"]
    count = row_value(evt, "flops")
    return count / seconds if count > 0 and seconds > 0 else 0.0
