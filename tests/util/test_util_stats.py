"""The one median rule, nearest-rank percentiles and the rank test: voice_llm.core.util.stats."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from voice_llm.core.util import stats


def test_the_median_of_an_odd_count_is_the_middle() -> None:
    assert stats.median([5.0, 1.0, 3.0]) == 3.0
    assert stats.median([40.0, 10.0, 30.0, 50.0, 20.0]) == 30.0  # the brief's "third of five"


def test_the_median_of_an_even_count_is_the_upper_middle_a_measured_value() -> None:
    values = [1.0, 2.0, 3.0, 10.0]
    assert stats.median(values) == 3.0
    assert statistics.median(values) == 2.5  # the rule it is not: a value nobody measured
    assert stats.median(values) in values


def test_the_median_of_no_values_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        stats.median([])


def test_median_index_points_at_the_first_repeat_with_the_median() -> None:
    assert stats.median_index([300.0, 100.0, 200.0, 200.0]) == 2  # upper middle 200: its first repeat
    assert stats.median_index([7.0]) == 0


def test_p50_is_the_median_rule_not_the_nearest_rank() -> None:
    # Nearest rank alone would give the lower middle (2.0) for an even count.
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == stats.median([1.0, 2.0, 3.0, 4.0]) == 3.0


@pytest.mark.parametrize(("q", "expected"), [(0, 1.0), (10, 1.0), (11, 2.0), (90, 9.0), (91, 10.0), (99, 10.0),
                                             (100, 10.0)])
def test_other_percentiles_are_nearest_rank(q: float, expected: float) -> None:
    values = [float(v) for v in (7, 3, 10, 1, 9, 2, 8, 4, 6, 5)]
    assert stats.percentile(values, q) == expected


def test_percentiles_of_nothing_are_none_and_out_of_range_refused() -> None:
    assert stats.percentile([], 90) is None
    with pytest.raises(ValueError, match="between 0 and 100"):
        stats.percentile([1.0], 101)


def test_gaps_are_between_consecutive_times() -> None:
    assert stats.gaps_ms([10.0, 15.0, 30.0]) == [5.0, 15.0]
    assert stats.gaps_ms([10.0]) == [] and stats.gaps_ms([]) == []


def test_summarize_takes_medians_and_ranges_with_the_one_rule() -> None:
    repeats = [{"t": 4.0, "n": 7}, {"t": 1.0, "n": 7}, {"t": 3.0, "n": 7}, {"t": 2.0, "n": 7}]
    doc = stats.summarize(repeats, ("t", "n"), ("t",))
    assert doc == {"t": 3.0, "t_min": 1.0, "t_max": 4.0, "n": 7}


def _permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided p by brute force over every split of the pooled values (U with midranks)."""
    pooled = a + b
    ranks = {v: (sorted(pooled).index(v) + 1 + len(pooled) - sorted(pooled, reverse=True).index(v)) / 2 for v in pooled}
    n1 = len(a)
    mean = n1 * len(b) / 2

    def u(group: tuple[float, ...]) -> float:
        return sum(ranks[v] for v in group) - n1 * (n1 + 1) / 2

    observed = abs(u(tuple(a)) - mean)
    splits = list(itertools.combinations(pooled, n1))
    return sum(1 for s in splits if abs(u(s) - mean) >= observed - 1e-9) / len(splits)


@pytest.mark.parametrize(("a", "b"), [
    ([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]),
    ([1.0, 3.0, 5.0, 7.0, 9.0], [2.0, 4.0, 6.0, 8.0, 10.0]),
    ([1.0, 2.0, 2.0, 3.0, 5.0], [2.0, 3.0, 4.0, 4.0, 6.0, 7.0]),  # ties
])
def test_the_rank_test_is_exact_for_small_samples(a: list[float], b: list[float]) -> None:
    assert stats.mann_whitney_p(a, b) == pytest.approx(_permutation_p(a, b))


def test_the_rank_test_approximates_above_the_exact_limit() -> None:
    many = [float(v) for v in range(30)]
    assert math.comb(60, 30) > stats.EXACT_SPLITS_MAX
    assert stats.mann_whitney_p(many, many) == pytest.approx(1.0)
    assert stats.mann_whitney_p(many, [v + 1000 for v in many]) < 1e-9
    assert stats.mann_whitney_p([5.0] * 30, [5.0] * 30) == 1.0  # all tied: no difference, no division by zero


def test_the_rank_test_needs_both_sides() -> None:
    with pytest.raises(ValueError, match="both sides"):
        stats.mann_whitney_p([], [1.0])
