"""update_bn_stats on 2 and 4 real gloo processes: every rank ends with the
statistics of one process over the union of all ranks' batches, with one
collective; a failure on one rank raises on every rank (no hang)."""
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from mmstats.precise_bn import ESTIMATORS, update_bn_stats
from tests.helpers.dist import run_distributed
from .refs import (Bomb, assert_restored, assert_stats, bn_inputs,
                   make_batches, snapshot)


# -- distributed -----
class _DistNet(nn.Module):

    def __init__(self, sync=True):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 1)
        # SyncBN computes local statistics inside update_bn_stats (no
        # collective in forwards), so it runs on CPU with several ranks
        self.sync_bn = nn.SyncBatchNorm(4) if sync else nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)
        self.bn1d = nn.BatchNorm1d(3)

    def forward(self, x):
        x = self.sync_bn(self.conv2(torch.relu(self.bn(self.conv(x)))))
        return self.bn1d(self.fc(x.mean((2, 3))))


DIST_SIZES = [12, 7, 21]  # 40 samples per rank


def _rank_batches(rank):
    return make_batches((3, 6, 6),
                        DIST_SIZES,
                        seed=100 + rank,
                        shift=0.5 * rank)


def _stats(model):
    # numpy: tensors sent through the result queue would share memory with
    # a process that is exiting
    return {
        k: v.numpy().copy()
        for k, v in model.state_dict().items()
        if 'running' in k or 'num_batches' in k
    }


UNEVEN_SIZES = [10, 10, 10, 10]
UNEVEN_NUM_SAMPLES = 45


def _worker_uneven(rank, world_size, num_samples):
    model = _DistNet(sync=False)
    batches = make_batches((3, 6, 6),
                           UNEVEN_SIZES,
                           seed=200 + rank,
                           shift=0.3 * rank)
    summary = update_bn_stats(model, batches, num_samples, progress=False)
    return _stats(model), summary['num_samples'], summary['num_batches']


def check_uneven(results, world_size):
    """45 samples do not divide over the ranks: ceil(45 / 2) = 23 per rank
    takes 3 whole batches of 10 on 2 ranks, ceil(45 / 4) = 12 takes 2 on 4
    ranks; the result is the union of the batches actually used."""
    per_rank = {2: 3, 4: 2}[world_size]
    used = [
        b for rank in range(world_size) for b in make_batches(
            (3, 6, 6), UNEVEN_SIZES, seed=200 + rank, shift=0.3 *
            rank)[:per_rank]
    ]
    single = _DistNet(sync=False)
    captured = bn_inputs(single, used)
    update_bn_stats(single, used, 10**6, progress=False)
    assert_stats(single, captured, 'population')
    expected = _stats(single)
    for stats, num, batches in results:
        assert (num, batches) == (10 * per_rank * world_size,
                                  per_rank * world_size)
        for key, val in stats.items():
            np.testing.assert_allclose(
                val, expected[key], rtol=1e-6, atol=1e-7, err_msg=key)


def _worker_update(rank, world_size):
    out = {}
    for estimator in ESTIMATORS:
        # DDP refuses SyncBN on CPU: wrap the plain-BN variant only
        sync = estimator == 'population'
        model = _DistNet(sync)
        wrapped = model if sync else nn.parallel.DistributedDataParallel(model)
        calls = []
        real = dist.all_reduce

        def counting(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)

        dist.all_reduce = counting
        try:
            summary = update_bn_stats(
                wrapped,
                _rank_batches(rank),
                num_samples=40 * world_size,
                estimator=estimator,
                progress=False)
        finally:
            dist.all_reduce = real
        out[estimator] = (_stats(model), summary, len(calls))
    out['uneven'] = _worker_uneven(rank, world_size, UNEVEN_NUM_SAMPLES)
    return out


@pytest.mark.parametrize('world_size', [2, 4])
def test_distributed_equals_union(world_size):
    results = run_distributed(_worker_update, world_size)
    union = [b for r in range(world_size) for b in _rank_batches(r)]
    for estimator in ESTIMATORS:
        single = _DistNet(estimator == 'population')
        captured = bn_inputs(single, union)
        summary = update_bn_stats(
            single, union, 40 * world_size, estimator, progress=False)
        assert summary['num_batches'] == 3 * world_size
        assert_stats(single, captured, estimator)
        expected = _stats(single)
        for rank, res in enumerate(results):
            stats, dsummary, num_collectives = res[estimator]
            assert num_collectives == 1
            assert dsummary['num_samples'] == 40 * world_size
            assert dsummary['num_batches'] == 3 * world_size
            assert dsummary['num_layers'] == 3
            for key, val in stats.items():
                np.testing.assert_allclose(
                    val, expected[key], rtol=1e-6, atol=1e-7, err_msg=key)
                # bitwise identical on every rank
                assert np.array_equal(val, results[0][estimator][0][key])
    check_uneven([res['uneven'] for res in results], world_size)


def _worker_fail(rank, world_size):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 3), nn.BatchNorm1d(3), Bomb(2 if rank == 1 else -1),
        nn.BatchNorm1d(3))
    snap = snapshot(model)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randn(8, 4, generator=gen) for _ in range(4)]
    try:
        update_bn_stats(model, batches, 64, progress=False)
    except Exception as exc:  # noqa: BLE001
        assert_restored(model, snap)
        return type(exc).__name__, str(exc)
    return None


def test_failure_on_one_rank_raises_everywhere():
    results = run_distributed(_worker_fail, 2, timeout=60)
    assert results[0][0] == 'RuntimeError'
    assert 'another rank' in results[0][1]
    assert results[1] == ('RuntimeError', 'bomb went off at call 2')
