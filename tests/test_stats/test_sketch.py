"""Tests of the quantile sketch kernels against numpy on the raw values."""
import warnings

import numpy as np
import pytest
import torch

from mmstats.stats.pending import PendingSketches
from mmstats.stats.sketch import (DEFAULT_BUCKETS, LogBuckets, Sketch,
                                  bucket_counts, clamped_quantiles,
                                  group_bucket_counts, quantiles)
from mmstats.stats.sketch_sum import SketchSum, layout

QS = np.linspace(0, 1, 201)
ALPHA = DEFAULT_BUCKETS.relative_accuracy


def lower_quantiles(values, qs):
    """True lower-rank quantiles of the finite values (DDSketch's rank)."""
    x = np.sort(values[np.isfinite(values)])
    return x[np.floor(qs * (x.size - 1)).astype(np.int64)]


def log_uniform(rng, low, high, n=20000):
    """Positive values spread log-uniformly over ``[low, high]``."""
    return np.exp(rng.uniform(np.log(low), np.log(high), n))


def lognormal_6_decades(rng, n=20000):
    """Positive values spread over 6 decades (1e-3 .. 1e3)."""
    return log_uniform(rng, 1e-3, 1e3, n)


def mixed_sign(rng, n=20000, low=1e-3, high=1e3):
    """Both signs over ``[low, high]``, exact zeros, NaN and inf."""
    x = log_uniform(rng, low, high, n) * rng.choice([-1., 1.], n)
    x[rng.random(n) < 0.1] = 0.
    return np.concatenate([x, [np.nan, np.inf, -np.inf, -0.]])


def assert_within_alpha(got, true, alpha=ALPHA):
    err = np.abs(got - true)
    assert (err <= alpha * np.abs(true) * (1 + 1e-12)).all(), (
        float(np.max(err / np.maximum(np.abs(true), 1e-300))))


def assert_same(a, b):
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.counts, b.counts)


def both_paths(values, buckets=DEFAULT_BUCKETS):
    """The device kernel's and the host kernel's sketch of ``values``."""
    device = bucket_counts(torch.from_numpy(values), buckets)
    host = group_bucket_counts(values, np.zeros(values.size, np.int64), 1,
                               buckets)[0]
    return device, host


@pytest.mark.parametrize('make', [lognormal_6_decades, mixed_sign])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_quantiles_within_alpha_of_numpy(make, dtype):
    values = make(np.random.default_rng(0)).astype(
        np.float32 if dtype is torch.float32 else np.float64)
    sketch = bucket_counts(torch.from_numpy(values))
    assert sketch.total == np.isfinite(values).sum() and not sketch.collapsed
    true = lower_quantiles(values.astype(np.float64), QS)
    assert (true == np.quantile(
        values[np.isfinite(values)].astype(np.float64), QS,
        method='lower')).all()
    assert_within_alpha(quantiles(sketch, QS), true)


# (low, high, signs): the user's 1e-14..1e-11, subnormals, huge values
RANGES = [(1e-14, 1e-11, 1), (1e-14, 1e-11, -1), (1e-14, 1e-11, 0),
          (5e-324, 1e-310, 0), (1e-320, 1e-305, 1), (1e292, 1.7e308, 0),
          (1e-8, 1e9, 0)]


@pytest.mark.parametrize('low,high,signs', RANGES)
def test_any_float64_magnitude(low, high, signs):
    """Every magnitude has its own buckets (the old layout put all of
    1e-14..1e-11 in one edge bucket): every quantile within alpha."""
    rng = np.random.default_rng(7)
    values = log_uniform(rng, low, high, 5000)
    values *= rng.choice([-1., 1.], values.size) if signs == 0 else signs
    values[:50] = 0.
    true = lower_quantiles(values, QS)
    for sketch in both_paths(values):
        assert not sketch.collapsed
        assert_within_alpha(quantiles(sketch, QS), true)
        assert len(set(quantiles(sketch, [0.1, 0.5, 0.9]))) == 3


def test_1e300_range_with_enough_buckets():
    """1e-300 .. 1e300 (69k keys per sign) with max_buckets raised."""
    buckets = LogBuckets(max_buckets=80000)
    values = mixed_sign(np.random.default_rng(8), 20000, 1e-300, 1e300)
    true = lower_quantiles(values, QS)
    for sketch in both_paths(values, buckets):
        assert not sketch.collapsed
        assert_within_alpha(quantiles(sketch, QS, buckets), true)


def test_collapsed_values_are_counted_never_valued():
    """Default cap (2048 keys per sign, 17.8 decades): 1e-300 .. 1e300
    keeps the top buckets of each sign; smaller magnitudes are counted as
    collapsed and their quantiles are NaN (with a warning), the others
    within alpha."""
    values = mixed_sign(np.random.default_rng(9), 20000, 1e-300, 1e300)
    finite = values[np.isfinite(values)]
    true = lower_quantiles(values, QS)
    gamma = DEFAULT_BUCKETS.gamma
    edge = 1e300 * gamma**(-DEFAULT_BUCKETS.max_buckets + 1)
    lost = (finite != 0) & (np.abs(finite) <= edge * 1.05)
    for sketch in both_paths(values):
        got = quantiles(sketch, QS)
        assert sketch.total == finite.size
        # every value below the cap collapsed, none above
        assert abs(sketch.collapsed - lost.sum()) <= 4  # edge buckets
        kept = ~np.isnan(got)
        assert_within_alpha(got[kept], true[kept])
        assert (np.abs(true[~kept]) <= edge * 1.05).all()
        assert (true[~kept] != 0).all() and kept[:3].all() and kept[-3:].all()
        with pytest.warns(UserWarning, match='collapsed'):
            clamped_quantiles(sketch, QS, finite.min(), finite.max())


def test_zero_sign_and_empty():
    x = torch.tensor([-2., 0., 0., 0., 5.])
    got = quantiles(bucket_counts(x), [0., 0.25, 0.5, 0.75, 1.])
    assert got[1] == got[2] == got[3] == 0.
    assert abs(got[0] + 2) <= 2 * ALPHA and abs(got[4] - 5) <= 5 * ALPHA
    for x in (torch.zeros(0), torch.tensor([float('nan'), float('inf')])):
        sketch = bucket_counts(x)
        assert sketch.total == 0 and not sketch.codes.size
        assert np.isnan(quantiles(sketch, [0., 0.5, 1.])).all()


@pytest.mark.parametrize('low,high', [(1e-3, 1e3), (1e-300, 1e300)])
def test_merge_is_exact_whatever_the_split(low, high):
    """Device windows merged in place, host sketches added, and a mix: the
    sketch of all values, bit for bit (collapses included)."""
    rng = np.random.default_rng(1)
    values = mixed_sign(rng, 20000, low, high)
    parts = np.array_split(values, 7)
    whole = bucket_counts(torch.from_numpy(values))
    pending = PendingSketches()
    for part in parts:
        pending.add('x', torch.from_numpy(part))
    merged = pending.flush(['x'], np.zeros(0), np.zeros(0, np.int64))[0]
    assert_same(merged, whole)
    added = bucket_counts(torch.from_numpy(parts[3]))
    for i, part in enumerate(parts):
        if i != 3:
            added += group_bucket_counts(part, np.zeros(part.size, np.int64),
                                         1)[0]
    assert_same(added, whole)
    assert_same(both_paths(values)[1], whole)


def test_group_counts_match_tensor_counts():
    rng = np.random.default_rng(2)
    groups = [mixed_sign(rng, 500), np.zeros(0), lognormal_6_decades(rng, 9)]
    x = np.concatenate(groups)
    seg = np.repeat(np.arange(3), [g.size for g in groups])
    perm = rng.permutation(x.size)  # order within groups does not matter
    got = group_bucket_counts(x[perm], seg[perm], 3)
    assert len(got) == 3 and all(isinstance(s, Sketch) for s in got)
    for sketch, values in zip(got, groups):
        assert_same(sketch, bucket_counts(torch.from_numpy(values)))
    assert np.isnan(quantiles(got[1], QS)).all()
    assert_within_alpha(quantiles(got[0], QS), lower_quantiles(groups[0], QS))


def test_pending_sketches_flush_equals_sketch_of_all_values():
    """Report-time counts (large tensors, compactions), worker sketches and
    the host values at the flush: the sketch of everything, then empty."""
    rng = np.random.default_rng(6)
    large, parts = mixed_sign(rng,
                              5000), [mixed_sign(rng, 7) for _ in range(9)]
    host_a, host_b = mixed_sign(rng, 300), lognormal_6_decades(rng, 40)
    worker = mixed_sign(rng, 30, 1e-20, 1e-18)
    pending = PendingSketches()
    pending.add('a', torch.from_numpy(large))
    pending.add('a', torch.from_numpy(large[:100]))  # merged in place
    pending.add_many('b', [torch.from_numpy(p) for p in parts])
    pending.add_counts('b', bucket_counts(torch.from_numpy(worker)))
    values = np.concatenate([host_b, host_a])
    segs = np.repeat([1, 0], [host_b.size, host_a.size])
    got = pending.flush(['a', 'b', 'c'], values, segs)
    want_a = np.concatenate([large, large[:100], host_a])
    want_b = np.concatenate(parts + [worker, host_b])
    for sketch, want in zip(got, (want_a, want_b, np.zeros(0))):
        assert_same(sketch, bucket_counts(torch.from_numpy(want)))
    assert not pending.counts
    empty = pending.flush(['a'], np.zeros(0), np.zeros(0, np.int64))
    assert len(empty) == 1 and empty[0].total == 0


def _exchange(per_rank, buckets=DEFAULT_BUCKETS):
    """Simulated ranks: each rank's block for the global extremes, summed,
    unpacked (what Collector.update does through the collectives)."""
    names = sorted({n for r in per_rank for n in r})
    finite = {
        n: np.concatenate([r[n] for r in per_rank if n in r])
        for n in names
    }
    finite = {n: v[np.isfinite(v)] for n, v in finite.items()}
    low = np.array([v.min() if v.size else np.inf for v in finite.values()])
    high = np.array([v.max() if v.size else -np.inf for v in finite.values()])
    sums = []
    for r in per_rank:
        pending = {
            n: bucket_counts(torch.from_numpy(v), buckets)
            for n, v in r.items()
        }
        sums.append(SketchSum(pending, buckets))
    blocks = [s(names, low, high) for s in sums]
    assert len({b.size for b in blocks}) == 1  # the same shape everywhere
    total = np.sum(blocks, axis=0)
    return names, sums[0].unpack(total, names), blocks[0].size, finite


def test_sum_over_ranks_is_the_sketch_of_all_values():
    """3 simulated ranks, names on some ranks only, wide and narrow data:
    the unpacked sum equals the sketch of the concatenated values."""
    rng = np.random.default_rng(11)
    per_rank = [{
        'loss': log_uniform(rng, 0.5, 0.7, 16),
        'mixed': mixed_sign(rng, 3000),
        'tiny': -log_uniform(rng, 1e-14, 1e-11, 100),
        'wide': mixed_sign(rng, 3000, 1e-300, 1e300),
    } for _ in range(3)]
    per_rank[1]['only1'] = np.array([0., 0., 3.])
    del per_rank[2]['tiny']
    names, sketches, _, finite = _exchange(per_rank)
    for name, sketch in zip(names, sketches):
        everything = np.concatenate([r[name] for r in per_rank if name in r])
        assert_same(sketch, bucket_counts(torch.from_numpy(everything)))
        if name == 'wide':  # 600 decades: the smallest magnitudes collapse
            assert sketch.collapsed > 0
            continue
        got = clamped_quantiles(sketch, QS, finite[name].min(),
                                finite[name].max())
        assert_within_alpha(got, lower_quantiles(everything, QS))


def test_payload_bounded():
    """The block one rank sends: ~(3 + buckets between the extremes) per
    name; 1000 loss-like names well under 1 MB (33 MB before); any data at
    most max_total float64 (8 MB)."""
    rng = np.random.default_rng(12)
    levels = log_uniform(rng, 0.1, 10, 1000)
    losses = [{
        f'loss{i}': level * rng.uniform(0.8, 1.25, 20)
        for i, level in enumerate(levels)
    }]
    _, _, size, _ = _exchange(losses)
    assert size == 26103  # 209 KB: 26 float64 per name
    wide = [{f'w{i}': mixed_sign(rng, 50, 1e-30, 1e30) for i in range(1000)}]
    names, sketches, size, finite = _exchange(wide)
    assert size <= DEFAULT_BUCKETS.max_total
    assert size > DEFAULT_BUCKETS.max_total * 0.99  # the budget is used
    # 522 keys per sign each (4.5 decades below the largest), all counted
    assert all(s.total == finite[n].size for n, s in zip(names, sketches))
    for sketch in sketches:
        for side in (sketch.codes[sketch.codes > 1],
                     -sketch.codes[sketch.codes < -1]):
            assert side.max() - side.min() < 522
    small = LogBuckets(max_buckets=64, max_total=10**6)
    neg_top, neg_n, _, pos_n, offsets = layout(
        np.array([-1e-30, 1., -5., np.inf]), np.array([1e30, 2., -4.,
                                                       -np.inf]), small)
    assert neg_n.tolist() == [64, 0, 14, 0
                              ] and pos_n.tolist() == [64, 38, 0, 0]
    assert np.diff(offsets).tolist() == [131, 41, 17, 3]


def test_custom_layout_and_arguments():
    buckets = LogBuckets(relative_accuracy=0.05)
    values = lognormal_6_decades(np.random.default_rng(3))
    sketch = bucket_counts(torch.from_numpy(values), buckets)
    assert_within_alpha(
        quantiles(sketch, QS, buckets), lower_quantiles(values, QS), 0.05)
    assert quantiles(sketch, 0.5, buckets).shape == ()
    with pytest.raises(ValueError, match=r'qs must be in \[0, 1\]'):
        quantiles(sketch, [1.5], buckets)
    with pytest.raises(ValueError, match='relative_accuracy'):
        LogBuckets(relative_accuracy=1.)
    with pytest.raises(ValueError, match='max_buckets'):
        LogBuckets(max_buckets=0)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # nothing collapsed: no warning
        clamped_quantiles(sketch, QS, values.min(), values.max())


def test_matches_ddsketch_package():
    """Same buckets and quantiles as the reference implementation
    (``ddsketch`` is a test requirement: this never skips)."""
    import ddsketch
    values = mixed_sign(np.random.default_rng(4), 3000)
    reference = ddsketch.DDSketch(relative_accuracy=ALPHA)
    for v in values[np.isfinite(values)].tolist():
        reference.add(v)
    got = quantiles(bucket_counts(torch.from_numpy(values)), QS)
    want = np.array([reference.get_quantile_value(q) for q in QS])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('deterministic', [False, True])
def test_cuda_counts_without_sync(deterministic):
    """histc (index_add_ in deterministic mode) and the in-place merge
    equal the CPU counts, without a sync."""
    values = mixed_sign(np.random.default_rng(5))
    values[:5000] = 0.  # a popular bucket
    x = torch.from_numpy(values).float().cuda()
    pending = PendingSketches()
    pending.add('x', x)  # warm-up: lazy CUDA initialisation may sync
    torch.use_deterministic_algorithms(deterministic)
    torch.cuda.set_sync_debug_mode('error')
    try:
        pending.add('x', x * 1e-20)
    finally:
        torch.cuda.set_sync_debug_mode('default')
        torch.use_deterministic_algorithms(False)
    got = pending.flush(['x'], np.zeros(0), np.zeros(0, np.int64))[0]
    want = torch.cat([x, x * 1e-20]).cpu()
    assert_same(got, bucket_counts(want))
