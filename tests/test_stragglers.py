"""No false stragglers (issue 31, 3): the rule of ``opscope.analysis.ranks.stragglers``.

Real balanced jobs (``tests/ranks_workloads/ddp_train.py`` under torchrun on gloo, no rank
slower by design, several steps each) of 2, 3 and 4 ranks, one job per rank count on a
module-scoped fixture, name no straggler, where the rule before named one in each of 11 such
jobs. The planted stragglers (a rank sleeping before each backward) stay named by
tests/test_ranks.py. Synthetic arrivals check the rule's edges. No duration is asserted.
"""

from __future__ import annotations

import glob

import numpy as np
import pytest

from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.analysis.ranks.facts import load_ranks
from opscope.analysis.ranks.stragglers import (MIN_LATE_COLLECTIVES, NOISE_FACTOR, Straggler,
                                         find_stragglers, lateness_matrix)
from test_ranks import run_job

BALANCED_STEPS = 8


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"{n}_ranks")
def balanced_job(request, tmp_path_factory):
    """A balanced DDP job of N ranks, BALANCED_STEPS steps; its rank traces."""
    folder = tmp_path_factory.mktemp(f"balanced{request.param}")
    run_job(folder, request.param, "--steps", str(BALANCED_STEPS))
    paths = sorted(glob.glob(str(folder / "train.rank*.pt.trace.json")))
    assert len(paths) == request.param
    return request.param, paths


def test_a_balanced_job_has_no_straggler(balanced_job):
    world, paths = balanced_job
    result = analyse_ranks(load_ranks(paths))
    assert len(result.collectives) >= BALANCED_STEPS, result.collectives  # matched, all ranks
    assert all(len(c.ranks) == world for c in result.collectives)
    assert result.stragglers == [], result.stragglers


def jittered(ranks: int, collectives: int, jitter_ms: float, seed: int = 0):
    """Arrivals 100 ms apart, each rank up to ``jitter_ms`` after the grid point."""
    rng = np.random.default_rng(seed)
    return [{r: 100.0 * c + float(rng.uniform(0, jitter_ms)) for r in range(ranks)}
            for c in range(collectives)]


def late_at(arrivals, rank: int, ms: float, every: int = 1):
    """``arrivals`` with ``rank`` late by ``ms`` at every ``every``-th collective."""
    return [{r: t + (ms if r == rank and c % every == 0 else 0.0) for r, t in here.items()}
            for c, here in enumerate(arrivals)]


@pytest.mark.parametrize("ranks", [2, 3, 4, 16])
def test_noise_alone_names_nobody(ranks):
    for seed in range(5):
        assert find_stragglers(jittered(ranks, 40, 3.0, seed), floor_ms=1.0) == []


@pytest.mark.parametrize("ranks", [2, 3, 4, 16])
@pytest.mark.parametrize("every", [1, 2])  # at every collective; at every other (a backward)
def test_a_rank_late_beyond_the_noise_is_named(ranks, every):
    arrivals = late_at(jittered(ranks, 40, 3.0), 1, 50.0, every)
    (found,) = find_stragglers(arrivals, floor_ms=1.0)
    assert (found.rank, found.late_count) == (1, 40 // every)
    assert 47.0 <= found.mean_lateness_ms <= 53.0


def test_one_late_arrival_is_not_a_straggler():
    """The first collective of a window (profilers started apart), a rank descheduled once."""
    arrivals = jittered(4, 16, 3.0)
    arrivals[0][2] += 400.0
    assert find_stragglers(arrivals, floor_ms=1.0) == []
    arrivals[5][2] += 400.0  # twice in 16: under MIN_LATE_FRACTION
    assert find_stragglers(arrivals, floor_ms=1.0) == []


def test_a_rank_late_by_random_amounts_is_noise():
    """Late at every collective, by 1 to 40 ms at random: its own jitter is its noise."""
    rng = np.random.default_rng(3)
    arrivals = [{0: 100.0 * c, 1: 100.0 * c + float(rng.uniform(1, 40))} for c in range(16)]
    assert find_stragglers(arrivals, floor_ms=1.0) == []
    steady = [{0: 100.0 * c, 1: 100.0 * c + 30.0 + float(rng.uniform(0, 1))} for c in range(16)]
    assert [s.rank for s in find_stragglers(steady, floor_ms=1.0)] == [1]


def test_lateness_within_the_noise_factor_is_not_named():
    """Others late by about 2 ms; a rank late by just under 5 x that, at every collective."""
    arrivals = [{0: 100.0 * c + (2.0 if c % 2 else 0.0), 1: 100.0 * c + (0.0 if c % 2 else 2.0),
                 2: 100.0 * c + 1.0} for c in range(20)]
    assert find_stragglers(arrivals, floor_ms=0.5) == []
    below = [{**a, 3: a[2] + NOISE_FACTOR * 2.0 - 0.5} for a in arrivals]
    assert find_stragglers(below, floor_ms=0.5) == []
    above = [{**a, 3: a[2] + NOISE_FACTOR * 2.0 + 8.0} for a in arrivals]
    assert [s.rank for s in find_stragglers(above, floor_ms=0.5)] == [3]


def test_the_floor_holds_when_there_is_no_noise():
    arrivals = [{0: 10.0 * c, 1: 10.0 * c + 0.4} for c in range(10)]
    assert find_stragglers(arrivals, floor_ms=1.0) == []
    assert [s.rank for s in find_stragglers(arrivals, floor_ms=0.2)] == [1]


def test_two_stragglers_latest_first():
    """Rank 5 late by 30 ms at all 20 collectives, rank 6 by 80 at 10: 800 ms before 600."""
    arrivals = late_at(late_at(jittered(8, 20, 2.0), 5, 30.0), 6, 80.0, every=2)
    assert [s.rank for s in find_stragglers(arrivals, floor_ms=1.0)] == [6, 5]


def test_ranks_missing_at_a_collective_and_a_lone_rank():
    arrivals = late_at(jittered(3, 12, 2.0), 2, 40.0)
    del arrivals[3][2]  # a desync: rank 2 issued none there
    arrivals.append({0: 5000.0})  # one rank alone: no lateness
    ranks, late = lateness_matrix(arrivals)
    assert ranks == [0, 1, 2] and np.isnan(late[2, 3]) and np.isnan(late[:, -1]).all()
    assert find_stragglers(arrivals, floor_ms=1.0) == [
        Straggler(2, 11, pytest.approx(find_stragglers(arrivals, floor_ms=1.0)[0]
                                       .mean_lateness_ms))]
    assert find_stragglers([], floor_ms=1.0) == []


def test_a_job_of_one_collective_is_judged_on_it():
    assert MIN_LATE_COLLECTIVES > 1
    assert [s.rank for s in find_stragglers([{0: 0.0, 1: 400.0}], floor_ms=1.0)] == [1]
    assert find_stragglers([{0: 0.0, 1: 0.5}], floor_ms=1.0) == []
