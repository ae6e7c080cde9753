"""Rule-based advice, each item citing the numbers that triggered it.

Every rule reads the aggregates the report already computed (the step
breakdown, the operator rows) plus a few vectorised counts over the table,
and returns None or a ``Recommendation``. A rule fires only when the time it
points at is at least ``MATERIAL_SHARE`` of the step time (its evidence says
so), and the page lists the rules that fired by the time they could save,
largest first (advice that only informs, severity "info", after the rest).

Example::

    >>> r = Recommendation("data", "Data loading", "use workers", ["12% of step time"],
    ...                    saving_us=120.0)
    >>> r.as_dict()["evidence"], r.as_dict()["saving_us"]
    (['12% of step time'], 120.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from opscope.analysis.categories import (COMMUNICATION, DATA_LOADING, OPTIMIZER, op_kind,
                                         top_level_ops)
from opscope.analysis.facts import shapes_recorded
from opscope.model.session import ProfileSession
from opscope.report.overview import step_overview

MATERIAL_SHARE = 0.05  # a rule fires only on at least this share of step time
DATA_LOADING_SHARE = 0.05
SHORT_OP_US = 10.0
SHORT_OP_TIME_SHARE = 0.5
SHORT_OP_COUNT_SHARE = 0.8
COPY_NAMES = ("aten::copy_", "aten::to", "aten::_to_copy")
COPY_CALLS_PER_STEP = 50
SMALL_COPY_US = 20.0
OPTIMIZER_SHARE = 0.2
STEP_SPREAD = 1.5
COMMUNICATION_SHARE = 0.2
SHAPE_KINDS = ("matmul/conv",)


@dataclass
class Recommendation:
    """One piece of advice: what, why, and the measured numbers behind it."""

    id: str
    title: str
    advice: str
    evidence: List[str] = field(default_factory=list)
    severity: str = "medium"
    saving_us: float = 0.0  # the time the advice could save, over all steps

    def as_dict(self) -> Dict[str, Any]:
        """The recommendation as the page's JSON object."""
        return asdict(self)


@dataclass
class RuleInputs:
    """What the rules read: the session and the report's aggregates."""

    session: ProfileSession
    overview: Dict[str, Any]
    operators: Dict[str, Any]

    def share(self, category: str) -> tuple:
        """(time in ``category``, total step time), in us, over all steps."""
        cats = self.overview["categories"]
        k = cats.index(category)
        steps = self.overview["steps"]
        return sum(s["parts"][k] for s in steps), sum(s["dur_us"] for s in steps)

    @property
    def step_total_us(self) -> float:
        """Summed duration of the steps shown, in us."""
        return sum(s["dur_us"] for s in self.overview["steps"])

    def material(self, cost_us: float) -> bool:
        """True when ``cost_us`` is at least ``MATERIAL_SHARE`` of the step time."""
        total = self.step_total_us
        return total > 0 and cost_us >= MATERIAL_SHARE * total

    def share_text(self, cost_us: float) -> str:
        """``cost_us`` as a share of step time, with the threshold rules fire at."""
        return (f"{_pct(cost_us / max(self.step_total_us, 1e-9))} of step time "
                f"(rules fire at {_pct(MATERIAL_SHARE)} or more)")

    @property
    def n_steps(self) -> int:
        """Number of steps (at least 1, so per-step figures never divide by 0)."""
        return max(1, len(self.overview["steps"]))


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _us(x: float) -> str:
    return f"{x / 1000.0:.3f} ms" if x >= 1000 else f"{x:.1f} us"


def data_loading(f: RuleInputs) -> Optional[Recommendation]:
    """Fires when data loading takes more than ``DATA_LOADING_SHARE`` of step time."""
    spent, total = f.share(DATA_LOADING)
    if total <= 0 or spent / total <= DATA_LOADING_SHARE or not f.material(spent):
        return None
    return Recommendation(
        "data-loading", "Data loading takes a large share of each step",
        "Load batches in the background: DataLoader(num_workers=N, pin_memory=True, "
        "persistent_workers=True, prefetch_factor=2), and keep decoding/augmentation "
        "out of the training loop.",
        [f"data loading: {_pct(spent / total)} of step time "
         f"({_us(spent / f.n_steps)} of {_us(total / f.n_steps)} per step), "
         f"above the {_pct(DATA_LOADING_SHARE)} threshold"], "high", spent)


def host_bound(f: RuleInputs) -> Optional[Recommendation]:
    """Fires when top-level ops shorter than ``SHORT_OP_US`` dominate (by time or count)."""
    table = f.session.table
    if len(table) == 0:
        return None
    top = top_level_ops(table)
    dur_us = table.duration_ns[top] / 1000.0
    if len(dur_us) < 20:
        return None
    short = dur_us < SHORT_OP_US
    count_share = float(short.mean())
    time_share = float(dur_us[short].sum() / max(dur_us.sum(), 1e-9))
    short_us = float(dur_us[short].sum())
    if time_share < SHORT_OP_TIME_SHARE and count_share < SHORT_OP_COUNT_SHARE:
        return None
    if not f.material(short_us):
        return None
    return Recommendation(
        "host-bound", "Steps are dominated by ops shorter than 10 us (host-bound)",
        "Per-op overhead (Python, dispatcher) dominates the real work. Fuse ops with "
        "torch.compile, replay with CUDA graphs on a GPU, or use larger batches.",
        [f"{int(short.sum())} of {len(dur_us)} top-level ops ({_pct(count_share)}) ran "
         f"shorter than {SHORT_OP_US:.0f} us",
         f"they take {_pct(time_share)} of top-level op time, "
         f"{f.share_text(short_us)}",
         f"median top-level op: {float(np.median(dur_us)):.1f} us"], "high", short_us)


def small_copies(f: RuleInputs) -> Optional[Recommendation]:
    """Fires on many short ``aten::copy_``/``aten::to`` calls per step."""
    rows = [r for r in f.operators["rows"] if r["name"] in COPY_NAMES and not r["user"]]
    calls = sum(r["calls"] for r in rows)
    total_us = sum(r["total_us"] for r in rows)
    if not rows or calls / f.n_steps < COPY_CALLS_PER_STEP or total_us / calls >= SMALL_COPY_US:
        return None
    if not f.material(total_us):
        return None
    parts = ", ".join(f"{r['name']} x{r['calls']}" for r in rows)
    return Recommendation(
        "small-copies", "Many small aten::copy_ / aten::to calls",
        "Each small copy or dtype/device conversion costs a dispatch. Create tensors "
        "with the right dtype and device up front, move whole batches once, and avoid "
        ".to()/.float()/.cpu() inside the loop.",
        [f"{calls} calls ({parts}), {calls / f.n_steps:.0f} per step",
         f"average {total_us / calls:.1f} us per call (below {SMALL_COPY_US:.0f} us)",
         f"{_us(total_us)} in total, {f.share_text(total_us)}"], saving_us=total_us)


def optimizer_share(f: RuleInputs) -> Optional[Recommendation]:
    """Fires when the optimizer takes at least ``OPTIMIZER_SHARE`` of step time."""
    spent, total = f.share(OPTIMIZER)
    if total <= 0 or spent / total < OPTIMIZER_SHARE or not f.material(spent):
        return None
    foreach = any(r["name"].startswith("aten::_foreach_") for r in f.operators["rows"])
    advice = ("The optimizer already uses foreach kernels; try fused=True (Adam, AdamW, SGD) "
              "or torch.compile on the optimizer step." if foreach else
              "Update all parameters at once: create the optimizer with foreach=True, or "
              "fused=True where supported (Adam, AdamW, SGD).")
    return Recommendation(
        "optimizer", "The optimizer step is a large share of step time", advice,
        [f"optimizer: {_pct(spent / total)} of step time ({_us(spent / f.n_steps)} per step), "
         f"above the {_pct(OPTIMIZER_SHARE)} threshold",
         "foreach kernels seen: " + ("yes" if foreach else "no")], saving_us=spent)


def missing_shapes(f: RuleInputs) -> Optional[Recommendation]:
    """Fires when shapes were not recorded and a matmul/conv is among the top ops."""
    if shapes_recorded(f.session):
        return None
    ops = sorted((r for r in f.operators["rows"] if not r["user"]),
                 key=lambda r: -r["self_us"])[:3]
    hot = [r for r in ops if op_kind(r["name"]) in SHAPE_KINDS]
    total = f.operators["self_total_us"]
    hot_us = sum(r["self_us"] for r in hot)
    if not hot or total <= 0 or not f.material(hot_us):
        return None
    return Recommendation(
        "shapes", "Record input shapes to see which matmul/conv sizes cost the time",
        "Profile with record_shapes=True (opscope run --record-shapes); the Operators view "
        "then lists each op's input shapes, and key_averages(group_by_input_shape=True) "
        "splits the rows by shape.",
        [f"{r['name']}: {_pct(r['self_us'] / total)} of self time, {r['calls']} calls, "
         f"no shapes recorded" for r in hot] + [f"together {f.share_text(hot_us)}"],
        "info", hot_us)


def step_spread(f: RuleInputs) -> Optional[Recommendation]:
    """Fires when the slowest step exceeds ``STEP_SPREAD`` times the median."""
    spread = f.overview["spread"]
    if spread.get("count", 0) < 3 or spread["max"] <= STEP_SPREAD * spread["median"]:
        return None
    slow_us = sum(max(0.0, s["dur_us"] - spread["median"]) for s in f.overview["steps"])
    if not f.material(slow_us):
        return None
    return Recommendation(
        "spread", "Step times vary a lot",
        "Look at the slowest steps in the Timeline: a first-iteration warm-up, garbage "
        "collection, data stalls or logging every N steps are the usual causes.",
        [f"slowest step {_us(spread['max'])} is {spread['max'] / spread['median']:.1f}x the "
         f"median {_us(spread['median'])} (fastest {_us(spread['min'])}, "
         f"{spread['count']} steps)",
         f"time above the median step: {_us(slow_us)}, {f.share_text(slow_us)}"],
        "info", slow_us)


def waiting_on_ranks(f: RuleInputs) -> Optional[Recommendation]:
    """Fires when collectives (and waiting for them) take ``COMMUNICATION_SHARE`` of step time."""
    spent, total = f.share(COMMUNICATION)
    if total <= 0 or spent / total < COMMUNICATION_SHARE or not f.material(spent):
        return None
    rows = sorted((r for r in f.operators["rows"] if r.get("communication")),
                  key=lambda r: -r["total_us"])[:2]
    return Recommendation(
        "waiting-on-ranks", "This rank spends its steps in collectives, waiting for the others",
        "A collective ends when the last rank arrives, so this time is mostly waiting for a "
        "slower rank (a straggler) or for the transfer. Profile every rank and run `opscope "
        "ranks DIR` (or `opscope report DIR`) on their traces to name the straggler and see "
        "each collective's wait and transfer; then even out the work across ranks (batch "
        "sizes, data loading, logging on one rank), and overlap communication with compute "
        "(DDP's bucket_cap_mb, no_sync() while accumulating gradients).",
        [f"communication: {_pct(spent / total)} of step time ({_us(spent / f.n_steps)} of "
         f"{_us(total / f.n_steps)} per step), above the {_pct(COMMUNICATION_SHARE)} threshold"]
        + [f"{r['name']}: {r['calls']} calls, {_us(r['total_us'])} in total" for r in rows],
        "high", spent)


RULES: List[Callable[[RuleInputs], Optional[Recommendation]]] = [
    data_loading, host_bound, small_copies, optimizer_share, missing_shapes, step_spread,
    waiting_on_ranks,
]


def recommendations(session: ProfileSession, overview: Dict[str, Any],
                    operators: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every rule that fires, as dicts for the page, the largest possible saving first."""
    inputs = RuleInputs(session, overview, operators)
    found = [r for r in (rule(inputs) for rule in RULES) if r is not None]
    found.sort(key=lambda r: (r.severity == "info", -r.saving_us))
    return [r.as_dict() for r in found]


def recommendations_view(inputs) -> List[Dict[str, Any]]:
    """The rules that fire (``opscope.report.views.ViewInputs``), read from every step."""
    return recommendations(inputs.session, inputs.shared(step_overview),
                           inputs.view("operators"))
