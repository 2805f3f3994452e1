"""Collector on real gloo processes: mismatched names, 2/4/8 ranks,
bit-identical results, constant collectives, a failure on one rank."""
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mmstats.stats import Collector, report, report0, reporting
from tests.helpers.dist import run_distributed
from tests.test_stats.test_collector import assert_stats

TIMEOUT = 90

# --------------------------------------------------------------------------
# Distributed (real gloo processes)
# --------------------------------------------------------------------------
STEPS = 4


def _plan(rank, world, step):
    """What ``rank`` reports at ``step``: [(name, via_report0, values)]."""
    rng = np.random.default_rng(1000 * rank + step)
    plan = [('loss', False, rng.normal(1e6, 1., size=3)),
            (f'only_r{rank}', False, rng.normal(size=rank + 1)),
            ('r0', True, np.array([100. * rank + step])),
            ('nan', False, np.array([float(rank), math.nan]))]
    if rank == world - 1 and step >= 2:  # appears in a later interval only
        plan.append(('late', False, rng.normal(size=2)))
    if rank == 1 and step == 1:  # a rank that reports nothing
        plan = []
    if rank % 2:  # different orders on different ranks
        plan = plan[::-1]
    return plan


def _dist_worker(rank, world):
    c_all = Collector()
    c_loss = Collector(regex='loss|only_r.*|late', keep_previous=False)
    out = []
    for step in range(STEPS):
        for i, (name, r0, values) in enumerate(_plan(rank, world, step)):
            fn = report0 if r0 else report
            value = (torch.from_numpy(values) if i % 2 else values.tolist())
            fn(name, value)
        c_all.update()
        if step % 2:
            c_loss.update()
            out.append((c_all.as_dict(), c_loss.as_dict()))
        else:
            out.append((c_all.as_dict(), None))
    return out


def _same(a, b):
    """Bit-identical nested dicts of floats (NaN == NaN)."""
    assert a.keys() == b.keys()
    for name in a:
        for key in a[name]:
            x, y = a[name][key], b[name][key]
            assert (math.isnan(x) and math.isnan(y)) or x == y, (name, key)


@pytest.mark.parametrize('world', [2, 4])
def test_distributed_mismatched_names(world):
    results = run_distributed(_dist_worker, world, timeout=TIMEOUT)
    for other in results[1:]:  # identical on every rank
        for (a0, l0), (a1, l1) in zip(results[0], other):
            _same(a0, a1)
            if l0 is not None:
                _same(l0, l1)
    seen = set()
    loss_window = {}
    for step, (got_all, got_loss) in enumerate(results[0]):
        values = {}
        for rank in range(world):
            for name, r0, v in _plan(rank, world, step):
                vals = values.setdefault(name, [])
                if not r0 or rank == 0:
                    vals.append(v)
                loss_window.setdefault(
                    name, []).append(v if not r0 or rank == 0 else v[:0])
        seen |= set(values)
        assert sorted(got_all) == sorted(seen)
        for name, vals in values.items():
            assert_stats(got_all[name], np.concatenate(vals), name)
        if got_loss is not None:
            names = sorted(n for n in seen
                           if n == 'loss' or n.startswith(('only', 'late')))
            assert sorted(got_loss) == names
            for name in names:
                assert_stats(got_loss[name],
                             np.concatenate(loss_window.get(name, [[]])), name)
            loss_window = {}
    assert 'late' in results[0][-1][0] and 'only_r1' in results[0][-1][0]


def _count_worker(rank, world, sizes):
    counts = {}
    orig = {
        n: getattr(dist, n)
        for n in ('all_gather', 'all_reduce', 'all_gather_object', 'broadcast',
                  'all_gather_into_tensor', 'broadcast_object_list')
    }

    def wrap(n):

        def fn(*args, **kwargs):
            counts[n] = counts.get(n, 0) + 1
            return orig[n](*args, **kwargs)

        return fn

    out = {}
    try:
        for n in orig:
            setattr(dist, n, wrap(n))
        for size in sizes:
            c = Collector()
            names = [f'n{i}' for i in range(size)]
            for step in range(3):
                counts.clear()
                # each rank reports a different half of the names
                for name in names[rank::world][::-1 if rank else 1]:
                    report(name, float(step))
                if step == 2:
                    report(f'new{rank}', 1.0)
                c.update()
                out[(size, step)] = sum(counts.values())
            out[(size, 'num')] = c.num('n0'), c.num('new1'), len(c.names())
            del c
    finally:
        for n, f in orig.items():
            setattr(dist, n, f)
    return out


def test_distributed_constant_collectives():
    results = run_distributed(_count_worker, 2, (10, 200), timeout=TIMEOUT)
    for out in results:
        for size in (10, 200):
            # 2 ranks: the small-group algorithm (protocol.py). The
            # table settles: gather+flags, names, max, gather
            assert out[(size, 0)] == 4
            assert out[(size, 1)] == 1  # steady state: one all_gather
            assert out[(size, 2)] == 4  # a new name on some rank
            assert out[(size, 'num')] == (1., 1., size + 2)


def _sizes_worker(rank, world):
    """Per update: the collectives' element counts; the published stats."""
    sent = []
    orig = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        sent.append(tensor.numel())
        return orig(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    try:
        c = Collector()
        out = []
        for step in range(3):
            sent.clear()
            rng = np.random.default_rng(100 * rank + step)
            # uneven sizes per rank, large mean, a name only some ranks have
            report('loss', torch.from_numpy(rng.normal(1e6, 1., 3 + rank)))
            if rank % 3 == 0:
                report('sparse', rng.normal(size=2).tolist())
            c.update()
            out.append((list(sent), c.as_dict()))
        return out
    finally:
        dist.all_reduce = orig


@pytest.mark.parametrize('world', [8])
def test_collective_size_does_not_grow_with_ranks(world):
    results = run_distributed(_sizes_worker, world, timeout=TIMEOUT)
    for step in range(3):
        got = results[0][step][1]
        for other in results[1:]:
            _same(got, other[step][1])  # bit-identical on every rank
        loss = np.concatenate([
            np.random.default_rng(100 * r + step).normal(1e6, 1., 3 + r)
            for r in range(world)
        ])
        assert_stats(got['loss'], loss, 'loss')
        sparse = np.concatenate([
            np.random.default_rng(100 * r + step).normal(1e6, 1., 3 +
                                                         r)[:0] if r %
            3 else _sparse_values(r, step) for r in range(world)
        ])
        assert_stats(got['sparse'], sparse, 'sparse')
    # steady state: max [error, new, 2 x 2 names], sum 3 x 2, sum 2 x 2
    for rank_out in results:
        assert rank_out[-1][0] == [6, 6, 4]


def _sparse_values(rank, step):
    rng = np.random.default_rng(100 * rank + step)
    rng.normal(1e6, 1., 3 + rank)
    return rng.normal(size=2)


def _failing_worker(rank, world):
    c = Collector()
    report('a', float(rank))
    c.update()
    report('b', [rank + 1., 10.])
    orig = reporting.REPORTER.store.flush
    if rank == 1:  # an unexpected failure on one rank only

        def broken(*args, **kwargs):
            raise OSError('injected')

        reporting.REPORTER.store.flush = broken
    try:
        c.update()
    except RuntimeError as e:
        error = f'{type(e).__name__}: {e} <- {e.__cause__!r}'
    else:
        error = None
    finally:
        reporting.REPORTER.store.flush = orig
    report('c', 5.)
    c.update()
    return error, c.as_dict()


def test_failure_on_one_rank_raises_everywhere_and_keeps_values():
    results = run_distributed(_failing_worker, 2, timeout=TIMEOUT)
    (err0, got0), (err1, got1) = results
    assert 'update() failed on rank 1' in err0 and err0.endswith('None')
    assert 'update() failed on rank 1' in err1 and 'injected' in err1
    _same(got0, got1)
    assert_stats(got0['b'], [1., 10., 2., 10.], 'b')  # nothing was lost
    assert_stats(got0['c'], [5., 5.], 'c')
