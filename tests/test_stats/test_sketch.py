"""Tests of the quantile sketch kernels against numpy on the raw values."""
import numpy as np
import pytest
import torch

from mmstats.stats.pending_sketches import PendingSketches
from mmstats.stats.sketch import (DEFAULT_BUCKETS, LogBuckets, bucket_counts,
                                  group_bucket_counts, quantiles)

QS = np.linspace(0, 1, 201)
ALPHA = DEFAULT_BUCKETS.relative_accuracy


def lower_quantiles(values, qs):
    """True lower-rank quantiles of the finite values (DDSketch's rank)."""
    x = np.sort(values[np.isfinite(values)])
    return x[np.floor(qs * (x.size - 1)).astype(np.int64)]


def lognormal_6_decades(rng, n=20000):
    """Positive values spread over 6 decades (1e-3 .. 1e3)."""
    return np.exp(rng.uniform(np.log(1e-3), np.log(1e3), n))


def mixed_sign(rng, n=20000):
    """Both signs over 6 decades, exact zeros, NaN and inf."""
    x = lognormal_6_decades(rng, n) * rng.choice([-1., 1.], n)
    x[rng.random(n) < 0.1] = 0.
    return np.concatenate([x, [np.nan, np.inf, -np.inf, -0.]])


def assert_within_alpha(got, true, alpha=ALPHA):
    err = np.abs(got - true)
    assert (err <= alpha * np.abs(true) * (1 + 1e-12)).all(), (
        float(np.max(err / np.maximum(np.abs(true), 1e-300))))


@pytest.mark.parametrize('make', [lognormal_6_decades, mixed_sign])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_quantiles_within_alpha_of_numpy(make, dtype):
    values = make(np.random.default_rng(0)).astype(
        np.float32 if dtype is torch.float32 else np.float64)
    counts = bucket_counts(torch.from_numpy(values))
    assert counts.dtype is torch.float64
    assert counts.shape == (DEFAULT_BUCKETS.size, )
    assert counts.sum() == np.isfinite(values).sum()
    true = lower_quantiles(values.astype(np.float64), QS)
    assert (true == np.quantile(
        values[np.isfinite(values)].astype(np.float64), QS,
        method='lower')).all()
    assert_within_alpha(quantiles(counts, QS), true)


def test_zero_sign_and_edges():
    x = torch.tensor([-2., 0., 0., 0., 5.])
    got = quantiles(bucket_counts(x), [0., 0.25, 0.5, 0.75, 1.])
    assert got[1] == got[2] == got[3] == 0.
    assert abs(got[0] + 2) <= 2 * ALPHA and abs(got[4] - 5) <= 5 * ALPHA
    # out of range: clamped into the edge buckets, still counted
    wide = bucket_counts(torch.tensor([1e-30, -1e30, 1e12]))
    assert wide[0] == wide[-1] == 1 and wide[DEFAULT_BUCKETS.zero_index +
                                             1] == 1


def test_empty_and_nonfinite_only():
    for x in (torch.zeros(0), torch.tensor([float('nan'), float('inf')])):
        counts = bucket_counts(x)
        assert counts.sum() == 0
        assert np.isnan(quantiles(counts, [0., 0.5, 1.])).all()


def test_merge_is_addition():
    rng = np.random.default_rng(1)
    values = mixed_sign(rng)
    whole = bucket_counts(torch.from_numpy(values))
    parts = sum(
        bucket_counts(torch.from_numpy(part))
        for part in np.array_split(values, 7))
    assert torch.equal(parts, whole)


def test_group_counts_match_tensor_counts():
    rng = np.random.default_rng(2)
    groups = [mixed_sign(rng, 500), np.zeros(0), lognormal_6_decades(rng, 9)]
    x = np.concatenate(groups)
    seg = np.repeat(np.arange(3), [g.size for g in groups])
    perm = rng.permutation(x.size)  # order within groups does not matter
    got = group_bucket_counts(x[perm], seg[perm], 3)
    assert got.shape == (3, DEFAULT_BUCKETS.size) and got.dtype == np.float64
    for row, values in zip(got, groups):
        np.testing.assert_array_equal(row,
                                      bucket_counts(torch.from_numpy(values)))
    batched = quantiles(got, QS)
    assert batched.shape == (3, QS.size) and np.isnan(batched[1]).all()
    assert_within_alpha(batched[0], lower_quantiles(groups[0], QS))


def test_pending_sketches_flush_equals_sketch_of_all_values():
    """Report-time counts (large tensors, compactions) plus the host values
    at the flush: the sketch of everything, per name, then empty."""
    rng = np.random.default_rng(6)
    large, parts = mixed_sign(rng,
                              5000), [mixed_sign(rng, 7) for _ in range(9)]
    host_a, host_b = mixed_sign(rng, 300), lognormal_6_decades(rng, 40)
    pending = PendingSketches()
    pending.add('a', torch.from_numpy(large))
    pending.add('a', torch.from_numpy(large[:100]))  # adds in place
    pending.add_many('b', [torch.from_numpy(p) for p in parts])
    values = np.concatenate([host_b, host_a])
    segs = np.repeat([1, 0], [host_b.size, host_a.size])
    got = pending.flush(['a', 'b', 'c'], values, segs)
    want_a = np.concatenate([large, large[:100], host_a])
    want_b = np.concatenate(parts + [host_b])
    for row, want in zip(got, (want_a, want_b, np.zeros(0))):
        np.testing.assert_array_equal(row,
                                      bucket_counts(torch.from_numpy(want)))
    assert not pending.counts
    empty = pending.flush(['a'], np.zeros(0), np.zeros(0, np.int64))
    assert empty.shape == (1, DEFAULT_BUCKETS.size) and not empty.any()


def test_custom_layout_and_arguments():
    buckets = LogBuckets(relative_accuracy=0.05, min_value=1e-3, max_value=1e3)
    assert buckets.size < DEFAULT_BUCKETS.size
    assert buckets.nbytes == buckets.size * 8
    values = lognormal_6_decades(np.random.default_rng(3))
    counts = bucket_counts(torch.from_numpy(values), buckets)
    assert_within_alpha(
        quantiles(counts, QS, buckets), lower_quantiles(values, QS), 0.05)
    assert quantiles(counts, 0.5, buckets).shape == ()
    with pytest.raises(ValueError, match='buckets'):
        quantiles(counts, 0.5)
    with pytest.raises(ValueError, match=r'qs must be in \[0, 1\]'):
        quantiles(counts, [1.5], buckets)
    with pytest.raises(ValueError, match='relative_accuracy'):
        LogBuckets(relative_accuracy=1.)
    with pytest.raises(ValueError, match='min_value'):
        LogBuckets(min_value=1., max_value=0.5)


def test_default_memory_per_name():
    """The documented size: 4149 buckets (33 KB float64) per name."""
    assert DEFAULT_BUCKETS.size == 4149
    assert DEFAULT_BUCKETS.nbytes == 33192


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
    """histc (index_add_ in deterministic mode) equals the CPU counts."""
    values = mixed_sign(np.random.default_rng(5))
    values[:5000] = 0.  # a popular bucket
    x = torch.from_numpy(values).float().cuda()
    bucket_counts(x)  # warm-up: lazy CUDA initialisation may sync
    torch.use_deterministic_algorithms(deterministic)
    torch.cuda.set_sync_debug_mode('error')
    try:
        counts = bucket_counts(x)
    finally:
        torch.cuda.set_sync_debug_mode('default')
        torch.use_deterministic_algorithms(False)
    assert counts.is_cuda and counts.dtype is torch.float64
    np.testing.assert_array_equal(counts.cpu(), bucket_counts(x.cpu()))


def _worker_merge(rank, world_size):
    """This rank's shard of mixed-sign data: counts, one all_reduce SUM."""
    import torch.distributed as dist
    values = mixed_sign(np.random.default_rng(40 + rank), 3000 + 500 * rank)
    counts = bucket_counts(torch.from_numpy(values))
    dist.all_reduce(counts)  # the one collective of Collector(sketch=True)
    return values, counts.numpy(), quantiles(counts, QS)


def test_all_reduce_sum_merges_ranks_exactly():
    """2 gloo ranks: the summed counts are the sketch of all ranks' values,
    every quantile within alpha of numpy's, the same bits on every rank."""
    from tests.helpers.dist import run_distributed
    results = run_distributed(_worker_merge, 2, timeout=90)
    everything = np.concatenate([values for values, _, _ in results])
    whole = bucket_counts(torch.from_numpy(everything)).numpy()
    for _, counts, got in results:
        np.testing.assert_array_equal(counts, whole)
        np.testing.assert_array_equal(got, results[0][2])
    assert_within_alpha(results[0][2], lower_quantiles(everything, QS))
