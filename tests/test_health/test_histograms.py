"""mmstats.health.histograms: a sketch's histogram counts every value in the
bucket TensorBoard reads it in, over gaps, zeros, both signs, collapsed
magnitudes and merged (capped) buckets; recomputed from the raw values."""
import numpy as np
import pytest
import torch

from mmstats.health.histograms import numpy_histogram, sketch_histogram
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


def _edge_values(buckets, keys):
    """Both signs of the edges ``E[k]`` of ``keys``, each one ulp below and
    above, and the values users meet on edges or near them (-1, 0.5, 2,
    integers, the extreme floats)."""
    column = keys - buckets.min_key + 1
    edges = np.concatenate(
        [buckets.edges[0, column], buckets.edges[1, column]])
    edges = edges[np.isfinite(edges) & (edges > 0)]
    near = np.concatenate([
        edges,
        np.nextafter(edges, 0.),
        np.nextafter(edges, np.inf), [0.5, 2., 5e-324, 2.0**-1022, 1e150],
        np.arange(1., 11.)
    ])
    near = near[np.isfinite(near) & (near > 0)]
    return np.concatenate([near, -near, [0., -0.]])


def _both_kernels(x, buckets):
    """The device kernel's and the host kernel's histogram of ``x``."""
    finite = x[np.isfinite(x)]
    args = (finite.size, finite.mean(), finite.std(), finite.min(),
            finite.max(), 10**6, buckets)
    host = buckets.group_bucket_counts(x, np.zeros(x.size, np.int64), 1)[0]
    return [
        sketch_histogram(bucket_counts(torch.from_numpy(x), buckets), *args),
        sketch_histogram(host, *args)
    ]


@pytest.mark.parametrize('keys', ['around_one', 'every_decade'])
def test_values_on_edges_and_one_ulp_beside_count_in_their_bucket(keys):
    """Every value exactly on a written limit, or one ulp either side of
    one, of both signs, is counted in ``(limit[i-1], limit[i]]`` (the
    device and the host kernels): -1 in the bucket ending at -1, 1 in the
    one ending at 1, 1 + ulp in the next."""
    buckets = LogBuckets(max_buckets=80000)  # nothing collapses
    if keys == 'around_one':
        keys = np.arange(-200, 201)
    else:  # subnormals to 1e150 (the sums of squares stay finite)
        top = int(np.log(1e150) * buckets.multiplier)
        keys = np.arange(buckets.min_key, top, 57)
    x = _edge_values(buckets, keys)
    for hist in _both_kernels(x, buckets):
        _check(hist, x)
        on_limits = x[np.isin(x, hist.bucket_limits)]
        assert on_limits.size > 0.3 * x.size  # values on the edges
        assert {-1., 1., 0.} <= set(on_limits.tolist())


def test_minus_one_is_counted_where_its_limit_says():
    """-2, -1, 0, 1: -1.0 is a bucket limit, and its bucket
    ``(limit[i-1], -1.0]`` holds it."""
    x = np.array([-2., -1., 0., 1.])
    hist = _histogram(x)
    _check(hist, x)
    limits = hist.bucket_limits.tolist()
    i = limits.index(-1.)
    assert hist.bucket_counts[i] == 1 and limits[i - 1] < -1.
    assert hist.bucket_counts[limits.index(1.)] == 1
    assert hist.bucket_counts[limits.index(0.)] == 1


@pytest.mark.parametrize('sign', [1., -1.])
def test_keys_are_exact_against_the_edge_table(sign):
    """The device and host keys equal the table's definition for magnitudes
    on every edge and one ulp beside it: positive values in
    ``(E[k-1], E[k]]``, negative magnitudes in ``[E[k-1], E[k])``."""
    buckets = DEFAULT_BUCKETS
    table = buckets.edges[0 if sign > 0 else 1]
    edges = table[np.isfinite(table) & (table > 0)]
    mags = np.unique(
        np.concatenate(
            [edges,
             np.nextafter(edges, 0.),
             np.nextafter(edges, np.inf)]))
    mags = mags[np.isfinite(mags) & (mags > 0)]
    side = 'left' if sign > 0 else 'right'
    want = np.searchsorted(table, mags, side=side) + buckets.min_key - 1
    host = np.abs(buckets.codes(sign * mags)) + buckets.min_key - 2
    np.testing.assert_array_equal(host, want)
    device = buckets._device_keys(torch.from_numpy(sign * mags))
    np.testing.assert_array_equal(device.numpy(), want)
    # a bucket's values lie within [gamma^(k-1), gamma^k] (alpha holds)
    with np.errstate(over='ignore'):
        lower = np.exp((want - 1) / buckets.multiplier)
        upper = np.exp(want / buckets.multiplier)
    assert (mags >= lower * (1 - 1e-12)).all()
    assert (mags <= upper * (1 + 1e-12)).all()


def test_pickled_buckets_leave_their_tables_behind():
    """A pickled layout (a DataLoader worker's, say) carries no edge table
    and no device copy, and counts the same after rebuilding them."""
    import pickle
    buckets = LogBuckets(relative_accuracy=0.05)
    x = np.array([-1., 1., 2., -0.5])
    codes = buckets.codes(x)
    buckets._device_keys(torch.from_numpy(x))  # a device copy made
    data = pickle.dumps(buckets)
    assert len(data) < 1000
    again = pickle.loads(data)
    np.testing.assert_array_equal(again.codes(x), codes)
