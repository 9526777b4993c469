"""Fitness and the paired comparison on known data."""

import numpy as np
import pytest

from evals.stats import fitness, paired_comparison, percentile


def test_fitness_follows_the_reference_formula():
    # fast and cheap: every term at 100, so fitness is the accuracy
    assert fitness(0.8, seconds_per_item=10, usd_per_item=0.001) == pytest.approx(80.0)
    # 600 s an item: normTime = 100*60/600 = 10; cost at the cap: normCost 100
    assert fitness(0.5, seconds_per_item=600, usd_per_item=0.01) == pytest.approx(0.7 * 50 + 0.2 * 10 * 0.5 + 5)
    # 0.05 USD an item: normCost = 100*0.005/0.05 = 10
    assert fitness(1.0, seconds_per_item=1, usd_per_item=0.05) == pytest.approx(70 + 20 + 0.1 * 10)
    assert fitness(0.0, seconds_per_item=1, usd_per_item=0) == 0
    assert fitness(1.5, seconds_per_item=1, usd_per_item=0) == 100  # capped


def test_wilcoxon_exact_p_value_on_known_data():
    # eight items, b better on each by a distinct amount: the exact two-sided p is 2 / 2**8
    a = [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.1, 0.2]
    b = [x + d for x, d in zip(a, [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08], strict=True)]
    result = paired_comparison(a, b, alpha=0.05)
    assert result.p_value == pytest.approx(2 / 2**8)
    assert result.verdict == "better" and result.significant
    assert result.mean_diff == pytest.approx(0.045)
    assert 0.01 < result.ci_low < 0.045 < result.ci_high < 0.08
    assert paired_comparison(b, a).verdict == "worse"


def test_no_difference_and_small_samples():
    same = paired_comparison([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert same.p_value == 1.0 and same.verdict == "no significant difference" and same.mean_diff == 0
    assert paired_comparison([], []).verdict == "not enough data"
    assert paired_comparison([0.1], [0.9]).verdict == "not enough data"
    mixed = paired_comparison([0.2, 0.8, 0.5, 0.4], [0.3, 0.7, 0.6, 0.3])
    assert mixed.verdict == "no significant difference" and mixed.p_value > 0.05
    with pytest.raises(ValueError):
        paired_comparison([0.1, 0.2], [0.1])


def test_the_interval_is_the_same_for_the_same_data():
    a, b = [0.1, 0.5, 0.3, 0.7, 0.2], [0.3, 0.6, 0.2, 0.9, 0.4]
    assert paired_comparison(a, b) == paired_comparison(a, b)


def test_percentiles():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([], 95) is None


def test_tied_items_do_not_turn_no_difference_into_better():
    """5 items improved and 9 tied: the zeros are dropped, so the exact test on the 5 decides (p = 2 / 2**5)."""
    a = [0.5] * 14
    b = [0.6, 0.7, 0.8, 0.9, 1.0] + [0.5] * 9
    result = paired_comparison(a, b)
    assert result.p_value == pytest.approx(0.0625)
    assert result.verdict == "no significant difference" and not result.significant
    assert result.n == 14 and result.mean_diff == pytest.approx(1.5 / 14, abs=1e-6)


def test_a_candidate_worse_on_almost_every_item_is_never_called_better():
    """Nineteen of twenty items drop a little and one jumps: the Wilcoxon test is highly significant
    *because the ranks are overwhelmingly negative*, while the mean difference is positive (and its 95%
    bootstrap interval spans 0). The verdict must not be "better" (the direction of a significant
    result is the test's: its rank sums, or a one-sided alternative), or a promotion goes through for
    a version that is worse on 95% of the set."""
    a = [0.5] * 19 + [0.0]
    b = [0.5 - 0.001 * (i + 1) for i in range(19)] + [1.0]
    comparison = paired_comparison(a, b)
    assert comparison.p_value < 0.05 and comparison.mean_diff > 0  # the data are as described
    assert comparison.verdict != "better", comparison


def test_the_p_value_is_scipys_on_the_non_zero_differences():
    """Seeded random cases with ties, zeros and every sample size the methods switch at (13, 50)."""
    from scipy.stats import wilcoxon

    rng = np.random.default_rng(20240601)
    for _ in range(60):
        n = int(rng.integers(2, 80))
        a = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=n)
        b = np.where(rng.random(n) < rng.random(), a, rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=n))
        if rng.random() < 0.5:
            b = np.clip(b + rng.normal(0, 0.05, size=n).round(3), 0, 1)
        nonzero = (b - a)[b != a]
        result = paired_comparison(a.tolist(), b.tolist(), resamples=200)
        expected = 1.0 if nonzero.size == 0 else float(wilcoxon(nonzero).pvalue)
        assert result.p_value == pytest.approx(expected, abs=1e-8), (a.tolist(), b.tolist())


def test_a_comparison_of_5000_items_stays_within_a_memory_bound():
    """The web process compares sets of up to EVAL_MAX_ITEMS_PER_SET items: the bootstrap resamples in batches."""
    import tracemalloc

    rng = np.random.default_rng(7)
    a = rng.random(5000).round(2)
    b = np.clip(a + rng.normal(0.01, 0.1, 5000), 0, 1).round(2)
    tracemalloc.start()
    try:
        result = paired_comparison(a.tolist(), b.tolist(), resamples=10_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 1024 * 1024, f"peak {peak / 1024 / 1024:.0f} MB"
    assert result.ci_low < result.mean_diff < result.ci_high
    assert paired_comparison(a.tolist(), b.tolist(), resamples=10_000) == result  # seeded
