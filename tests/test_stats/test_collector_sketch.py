"""Collector(sketch=True): quantiles against numpy on the union of every
rank's raw values (1, 2 and 4 gloo ranks), through every report() path."""
import gc
import math

import numpy as np
import pytest
import torch

from mmstats.stats import Collector, report
from mmstats.stats.collectives import ReduceFns
from mmstats.stats.pending_sketches import SKETCHES
from mmstats.stats.store import LARGE_NUMEL, MAX_PENDING_TENSORS
from tests.helpers.dist import run_distributed
from tests.test_stats.test_sketch import (QS, assert_within_alpha,
                                          lognormal_6_decades, lower_quantiles,
                                          mixed_sign)

TIMEOUT = 120
SMALL = 8  # elements per small tensor
NUM_FLOATS = 500


def _values(rank, step):
    """Each name's raw values on ``rank`` at ``step`` (float64)."""
    rng = np.random.default_rng(100 * rank + step)
    out = {
        'logn': lognormal_6_decades(rng, 10000),
        'mixed': mixed_sign(rng, 10000)
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
        assert sketch_calls == plain_calls  # no extra collective
    for step, got in enumerate(results[0][0]):
        per_rank = [_values(rank, step) for rank in range(world)]
        assert sorted(got) == ['logn', 'mixed', 'only0']
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
    assert SKETCHES.enabled
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
    assert not SKETCHES.enabled  # the last sketching collector is gone
