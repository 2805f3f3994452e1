"""Collector(sketch=True): quantiles against numpy on the union of every
rank's raw values (1, 2 and 4 gloo ranks), through every report() path."""
import gc
import math

import numpy as np
import pytest
import torch

from mmstats.stats import REPORTER, Collector, report
from mmstats.stats.pending import LARGE_NUMEL, MAX_PENDING_TENSORS
from mmstats.stats.protocol import GATHER_MAX_WORLD, ReduceFns
from tests.helpers.dist import run_distributed
from tests.test_stats.test_sketch import (QS, assert_within_alpha, log_uniform,
                                          lognormal_6_decades, lower_quantiles,
                                          mixed_sign)

TIMEOUT = 300  # a hang guard: 4 spawned ranks on a loaded 2-core machine
SMALL = 8  # elements per small tensor
NUM_FLOATS = 500


def _values(rank, step):
    """Each name's raw values on ``rank`` at ``step`` (float64)."""
    rng = np.random.default_rng(100 * rank + step)
    out = {
        'logn': lognormal_6_decades(rng, 10000),
        'mixed': mixed_sign(rng, 10000),
        # far below 1e-9 / above 1e9 (once all in one edge bucket)
        'tiny': mixed_sign(rng, 7000, 1e-14, 1e-11),
        'huge': -log_uniform(rng, 1e140, 1e150, 7000),
    }
    if rank == 0:  # a name only one rank reports
        out['only0'] = rng.normal(size=50)
    return out


def _report_all(name, x):
    """Through every path: Python floats, one large tensor (reduced at
    report time), many small tensors (compacted), one last small tensor."""
    for v in x[:NUM_FLOATS].tolist():
        report(name, v)
    rest = x[NUM_FLOATS:]
    large = LARGE_NUMEL + 1
    report(name, torch.from_numpy(rest[:large]))
    rest = rest[large:]
    small = (MAX_PENDING_TENSORS + 4) * SMALL
    for piece in np.split(rest[:small], small // SMALL):
        report(name, torch.from_numpy(piece))
    report(name, torch.from_numpy(rest[small:]))


class CountingFns(ReduceFns):
    """Real collectives, counted."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def all_reduce_sum(self, x):
        self.calls += 1
        return super().all_reduce_sum(x)

    def all_reduce_max(self, x):
        self.calls += 1
        return super().all_reduce_max(x)

    def all_gather_object(self, obj):
        self.calls += 1
        return super().all_gather_object(obj)

    def all_gather(self, x):
        self.calls += 1
        return super().all_gather(x)


def _sketch_worker(rank, world):
    plain_fns, sketch_fns = CountingFns(), CountingFns()
    plain = Collector(reduce_fns=plain_fns)
    sketched = Collector(reduce_fns=sketch_fns, sketch=True)
    out = []
    for step in range(2):
        for name, x in _values(rank, step).items():
            _report_all(name, x)
        plain.update()
        sketched.update()
        # the same moments (gloo may sum a longer buffer in another order)
        for name, stats in plain.as_dict().items():
            assert sketched.as_dict()[name] == pytest.approx(stats, rel=1e-12)
        out.append(
            {name: sketched.quantile(name, QS)
             for name in sketched.names()})
    return out, plain_fns.calls, sketch_fns.calls


@pytest.mark.parametrize('world', [1, 2, 4])
def test_quantiles_of_all_ranks_within_alpha(world):
    results = run_distributed(_sketch_worker, world, timeout=TIMEOUT)
    for rank_out, plain_calls, sketch_calls in results:
        assert rank_out == results[0][0]  # identical on every rank
        # small groups gather the rows, then SUM the sketch block sized by
        # the gathered extremes: one more collective per update (2 here)
        extra = 2 if world <= GATHER_MAX_WORLD else 0
        assert sketch_calls == plain_calls + extra
    for step, got in enumerate(results[0][0]):
        per_rank = [_values(rank, step) for rank in range(world)]
        assert sorted(got) == ['huge', 'logn', 'mixed', 'only0', 'tiny']
        for name, quantiles in got.items():
            union = np.concatenate([v[name] for v in per_rank if name in v])
            true = lower_quantiles(union, QS)
            assert_within_alpha(np.array(quantiles), true)
            finite = union[np.isfinite(union)]
            assert quantiles[0] == finite.min()
            assert quantiles[-1] == finite.max()


def test_quantile_api_and_keep_previous():
    with pytest.raises(ValueError, match='sketch=True'):
        Collector().quantile('x', 0.5)
    with pytest.raises(TypeError, match='sketch'):
        Collector(sketch='yes')
    kept = Collector(sketch=True)
    dropped = Collector(sketch=True, keep_previous=False)
    assert REPORTER.sketches.enabled
    values = np.arange(1., 101.)
    report('x', torch.from_numpy(values))
    for c in (kept, dropped):
        c.update()
    assert kept.quantile('x', 0.5) == pytest.approx(50., rel=0.01)
    assert kept.quantile('x', [0, 1]) == [1., 100.]
    assert math.isnan(kept.quantile('never', 0.5))
    with pytest.raises(ValueError, match=r'\[0, 1\]'):
        kept.quantile('x', 1.5)
    report('other', 1.)  # x gets no new value
    for c in (kept, dropped):
        c.update()
    assert kept.quantile('x', 0.99) == pytest.approx(99., rel=0.01)
    assert math.isnan(dropped.quantile('x', 0.99))
    assert dropped.quantile('other', 0.5) == 1.
    del kept, dropped, c
    gc.collect()
    assert not REPORTER.sketches.enabled  # the last sketching one is gone


def test_tiny_values_have_distinct_quantiles():
    """The user's report: data spanning 1e-14..1e-11 gave p10 = p50 = p90 =
    9.97e-12 (one edge bucket); now each within alpha of numpy's."""
    collector = Collector(sketch=True)
    values = log_uniform(np.random.default_rng(3), 1e-14, 1e-11, 5000)
    report('small', torch.from_numpy(values))
    for v in values[:100].tolist():
        report('small', v)
    collector.update()
    qs = np.array([0.1, 0.5, 0.9])
    got = np.array(collector.quantile('small', qs))
    assert_within_alpha(
        got, lower_quantiles(np.concatenate([values, values[:100]]), qs))


def test_collapsed_quantiles_are_nan_with_a_warning():
    """1e-300..1e300 exceeds the 2048 keys kept per sign: the quantiles of
    collapsed magnitudes are NaN with a warning naming the name, the others
    within alpha, the moments exact."""
    collector = Collector(sketch=True)
    values = mixed_sign(np.random.default_rng(4), 5000, 1e-300, 1e300)
    report('wide', torch.from_numpy(values))
    collector.update()
    finite = values[np.isfinite(values)]
    assert collector.num('wide') == finite.size
    with pytest.warns(UserWarning, match="'wide'.*collapsed"):
        got = np.array(collector.quantile('wide', QS))
    true = lower_quantiles(values, QS)
    kept = ~np.isnan(got)
    assert kept[:3].all() and kept[-3:].all() and not kept.all()
    assert_within_alpha(got[kept], true[kept])
    assert (np.abs(true[~kept]) < 1e283).all()  # 17.8 decades below 1e300


class SumSizes(ReduceFns):
    """Real collectives (one process), recording the SUM sizes."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def all_reduce_sum(self, x):
        self.sizes.append(x.size)
        return super().all_reduce_sum(x)


def test_payload_of_1000_loss_names():
    """StatsCollectorHook's default max_names=1000 with sketches on: one
    update sends 33 MB per rank before (4149 float64 per name); loss-like
    names (20 values within x1.56 of a level in [0.1, 10]) now ~210 KB, the
    count is exact and deterministic."""
    rng = np.random.default_rng(5)
    plain_fns, sketch_fns = SumSizes(), SumSizes()
    plain = Collector(reduce_fns=plain_fns, max_names=1000)
    sketched = Collector(reduce_fns=sketch_fns, max_names=1000, sketch=True)
    levels = log_uniform(rng, 0.1, 10, 1000)
    for i, level in enumerate(levels):
        for v in (level * rng.uniform(0.8, 1.25, 20)).tolist():
            report(f'loss{i:04d}', v)
    plain.update()
    sketched.update()
    extra = (sum(sketch_fns.sizes) - sum(plain_fns.sizes)) * 8
    assert extra == 26182 * 8 < 250_000
    assert sketched.quantile('loss0000', 0) == sketched.min('loss0000')


def test_eviction_keeps_sketches_aligned():
    """A name evicted by an update: the summed block is unpacked for the
    table it was built for, the kept names get their own counts."""
    collector = Collector(sketch=True, evict_after=1)
    report('a', [1., 2.])
    report('b', [100., 200., 300.])
    collector.update()
    report('b', [5., 6., 7.])
    collector.update()  # 'a' got nothing: evicted by this update
    assert collector.names() == ['b']
    got = collector.quantile('b', [0., 0.5, 1.])
    assert got[0] == 5. and got[2] == 7. and abs(got[1] - 6.) <= 0.06
