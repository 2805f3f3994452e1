"""mmstats.stats.histograms: a sketch's histogram counts every value in the
bucket TensorBoard reads it in, over gaps, zeros, both signs, collapsed
magnitudes and merged (capped) buckets; recomputed from the raw values."""
import numpy as np
import pytest
import torch

from mmstats.stats.histograms import numpy_histogram, sketch_histogram
from mmstats.stats.sketch import DEFAULT_BUCKETS, LogBuckets, bucket_counts


def _histogram(x, buckets=DEFAULT_BUCKETS, max_buckets=512):
    t = torch.from_numpy(x)
    finite = x[np.isfinite(x)]
    return sketch_histogram(
        bucket_counts(t, buckets), finite.size, finite.mean(), finite.std(),
        finite.min(), finite.max(), max_buckets, buckets)


def _check(hist, x):
    """Every finite value of ``x`` in ``(limit[i-1], limit[i]]``."""
    finite = x[np.isfinite(x)]
    limits, counts = hist.bucket_limits, hist.bucket_counts
    assert (np.diff(limits) > 0).all()
    assert limits[-1] == finite.max() and hist.min == finite.min()
    np.testing.assert_array_equal(
        counts,
        np.bincount(
            np.searchsorted(limits, finite, side='left'),
            minlength=len(limits)))
    assert hist.num == finite.size
    assert hist.sum == pytest.approx(finite.sum(), rel=1e-12, abs=1e-12)
    assert hist.sum_squares == pytest.approx(
        (finite * finite).sum(), rel=1e-12)


def _wide(seed=0, n=2000):
    gen = np.random.default_rng(seed)
    x = gen.standard_normal(n) * 10.0**gen.integers(-12, 6, n)
    x[::17] = 0.
    x[5] = np.nan  # not counted
    return x


def test_both_signs_zeros_and_gaps_count_exactly():
    x = _wide()
    hist = _histogram(x, max_buckets=10**6)  # not capped
    assert len(hist.bucket_limits) > 512
    _check(hist, x)
    # 1% accuracy: every filled kept bucket is at most gamma wide
    lower = np.concatenate([[hist.min], hist.bucket_limits[:-1]])
    filled = (hist.bucket_counts > 0) & (lower > 0)
    assert (hist.bucket_limits[filled] / lower[filled]
            <= DEFAULT_BUCKETS.gamma * (1 + 1e-12)).all()
    assert (hist.bucket_counts == 0).any()  # gaps got empty buckets


def test_collapsed_magnitudes_have_a_bucket_down_to_zero():
    buckets = LogBuckets(max_buckets=64)  # 64 keys: ~2.8 decades per sign
    x = _wide(1)
    sketch = bucket_counts(torch.from_numpy(x), buckets)
    assert sketch.collapsed > 0
    hist = _histogram(x, buckets)
    _check(hist, x)


@pytest.mark.parametrize('max_buckets', [1, 7, 100])
def test_capped_buckets_merge_runs_with_exact_counts(max_buckets):
    x = _wide(2)
    hist = _histogram(x, max_buckets=max_buckets)
    assert len(hist.bucket_limits) <= max_buckets
    _check(hist, x)


def test_single_value_and_no_value():
    x = np.array([3.5, 3.5])
    hist = _histogram(x)
    _check(hist, x)
    assert hist.bucket_counts.tolist() == [2.]
    empty = DEFAULT_BUCKETS.empty()
    assert sketch_histogram(empty, 0, np.nan, np.nan, np.nan, np.nan) is None


def test_numpy_form_is_what_numpy_histogram_returns():
    x = np.abs(_wide(3))
    x = x[np.isfinite(x)]
    counts, edges = numpy_histogram(_histogram(x))
    assert len(edges) == len(counts) + 1 and edges[0] == x.min()
    # numpy's convention ([a, b), the last closed) agrees away from edges
    inner = x[~np.isin(x, edges)]
    again, _ = np.histogram(inner, bins=edges)
    np.testing.assert_array_equal(
        again,
        np.bincount(
            np.searchsorted(edges[1:], inner, side='left'),
            minlength=len(counts)))
