"""Coverage numbers of a Dynamo profile: ``ProfileMetrics`` and ``ProfileResult``.

Names, fields and text follow ``torch._dynamo.profiler``. ``ProfileMetrics``
counts time, operators, "fusions" and graph calls; ``ProfileResult`` pairs the
captured metrics (ops that ran inside a compiled graph) with the totals.

Example::

    >>> captured = ProfileMetrics(microseconds=30.0, operators=3, fusions=2, graphs=1)
    >>> total = ProfileMetrics(microseconds=40.0, operators=4, fusions=3, graphs=1)
    >>> str(captured / total)
    ' 75% ops  75% time'
    >>> print(ProfileResult(captured, total, unique_graphs=1))
     1 graphs  1 graph calls    3/   4 =  75% ops  75% time
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Union


@dataclass
class ProfileMetrics:
    """Time (us), operator count, fusions and graph calls of one profile.

    ``+`` and ``+=`` add every field. ``/`` divides every field by the other
    metrics' field, or by an int, never by less than 1; ``str`` shows the
    operator and time fields as percentages (use it on a quotient).

    >>> m = ProfileMetrics(10.0, 4, 3, 1) + ProfileMetrics(6.0, 2, 1, 1)
    >>> m
    ProfileMetrics(microseconds=16.0, operators=6, fusions=4, graphs=2)
    >>> (m / 2).tocsv(), (m / 0).operators
    ([3.0, 8.0], 6.0)
    """

    microseconds: float = 0.0
    operators: int = 0
    fusions: int = 0
    graphs: int = 0

    def __iadd__(self, other: "ProfileMetrics") -> "ProfileMetrics":
        if not isinstance(other, ProfileMetrics):
            return NotImplemented
        self.microseconds += other.microseconds
        self.operators += other.operators
        self.fusions += other.fusions
        self.graphs += other.graphs
        return self

    def __add__(self, other: "ProfileMetrics") -> "ProfileMetrics":
        if not isinstance(other, ProfileMetrics):
            return NotImplemented
        return ProfileMetrics(self.microseconds + other.microseconds,
                              self.operators + other.operators,
                              self.fusions + other.fusions,
                              self.graphs + other.graphs)

    def __truediv__(self, other: Union[int, "ProfileMetrics"]) -> "ProfileMetrics":
        if isinstance(other, int) and not isinstance(other, bool):
            other = ProfileMetrics(other, other, other, other)
        if not isinstance(other, ProfileMetrics):
            return NotImplemented
        return ProfileMetrics(self.microseconds / max(1, other.microseconds),
                              self.operators / max(1, other.operators),
                              self.fusions / max(1, other.fusions),
                              self.graphs / max(1, other.graphs))

    def __str__(self) -> str:
        return f"{self.operators:4.0%} ops {self.microseconds:4.0%} time"

    def tocsv(self) -> List[float]:
        """``[operators, microseconds]``, the two columns of a coverage CSV row."""
        return [self.operators, self.microseconds]


class ProfileResult:
    """Captured and total metrics of a profile, plus the number of graphs compiled.

    >>> r = ProfileResult(ProfileMetrics(5.0, 1, 0, 1), ProfileMetrics(10.0, 4, 3, 1), 1)
    >>> r.percent().tocsv(), r.tocsv()
    ([0.25, 0.5], [1, 1, 1, 4, 0.25, 0.5])
    """

    def __init__(self, captured: Optional[ProfileMetrics], total: Optional[ProfileMetrics],
                 unique_graphs: int) -> None:
        for arg, value in (("captured", captured), ("total", total)):
            if value is not None and not isinstance(value, ProfileMetrics):
                raise TypeError(f"ProfileResult: {arg} must be a ProfileMetrics or None, "
                                f"got {type(value).__name__}")
        self.captured: ProfileMetrics = captured if captured is not None else ProfileMetrics()
        self.total: ProfileMetrics = total if total is not None else ProfileMetrics()
        self.unique_graphs: int = unique_graphs

    def __iadd__(self, other: "ProfileResult") -> "ProfileResult":
        if not isinstance(other, ProfileResult):
            return NotImplemented
        self.captured += other.captured
        self.total += other.total
        self.unique_graphs += other.unique_graphs
        return self

    def percent(self) -> ProfileMetrics:
        """The captured share of each metric (captured / total)."""
        return self.captured / self.total

    def __str__(self) -> str:
        return (f"{self.unique_graphs:2} graphs {self.captured.graphs:2} graph calls "
                f"{self.captured.operators:4}/{self.total.operators:4} = " + str(self.percent()))

    def __repr__(self) -> str:
        return (f"ProfileResult(captured={self.captured!r}, total={self.total!r}, "
                f"unique_graphs={self.unique_graphs!r})")

    def tocsv(self) -> List[Any]:
        """``[unique graphs, graph calls, captured ops, total ops, op share, time share]``."""
        return [self.unique_graphs, self.captured.graphs, self.captured.operators,
                self.total.operators] + self.percent().tocsv()
