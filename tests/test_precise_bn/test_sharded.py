"""update_bn_stats on sharded models (FSDP1, FSDP2) on 2 real gloo ranks.

Every forward of a sharded model is a collective, so every rank must run
the same forwards: the ranks agree before each batch. Uneven loaders, a
one-sample batch on one rank and a batch that cannot be prepared on one
rank must neither hang nor desynchronise the ranks, and a ``num_samples``
reached at a batch's end stops every rank there (the agreement on the next
batch counts the current one); the result is the statistics of one process
over the union of the batches actually used, identical on every rank, and
the model is left sharded.
"""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from mmstats.launch import abort_distributed
from mmstats.precise_bn import update_bn_stats
from mmstats.utils.torch_compat import fully_shard_api
from tests.helpers.dist import run_distributed
from .refs import assert_stats, bn_inputs, make_batches


class _Block(nn.Module):

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class _Net(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank
        self.block1 = _Block(3, 4)
        self.block2 = _Block(4, 4)
        self.fc = nn.Linear(4, 3)
        self.bn1d = nn.BatchNorm1d(3)

    def forward(self, x):
        x = self.block2(self.block1(x))
        return self.bn1d(self.fc(x.mean((2, 3))))


def _shard(model: nn.Module, kind: str) -> nn.Module:
    if kind == 'fsdp':
        from torch.distributed.fsdp import FullyShardedDataParallel
        return FullyShardedDataParallel(
            model, device_id=torch.device('cpu'), use_orig_params=True)
    fully_shard = fully_shard_api()[0]
    fully_shard(model.block1)
    fully_shard(model.block2)
    fully_shard(model)
    return model


def _stats(model: nn.Module) -> dict:
    return {
        k: v.numpy().copy()
        for k, v in model.state_dict().items() if 'running' in k
    }


def _batches(rank: int, sizes) -> list:
    return make_batches((3, 7, 7), sizes, seed=300 + rank, shift=0.4 * rank)


CASES = {
    # rank -> batch sizes; which batches (by position) every rank uses;
    # num_samples
    'uneven': ({
        0: [6, 6, 6],
        1: [6, 6]
    }, [0, 1], 10**6),  # rank 1 runs out: both stop
    'one_sample': ({
        0: [6, 6, 6, 6],
        1: [6, 1, 6, 6]
    }, [0, 2], 24),  # batch 1 skipped on both; 12 per rank reached at 2
}


def _worker(rank, world_size, kind, case):
    sizes, _, num_samples = CASES[case]
    model = _Net()
    sharded = _shard(model, kind)
    forwards = []
    sharded.register_forward_pre_hook(lambda *_: forwards.append(1))
    summary = update_bn_stats(
        sharded, _batches(rank, sizes[rank]), num_samples, progress=False)
    inner = sharded.module if kind == 'fsdp' else sharded
    return (_stats(inner), summary['num_batches'], len(forwards),
            summary['num_samples'])


@pytest.mark.parametrize('case', sorted(CASES))
@pytest.mark.parametrize('kind', ['fsdp', 'fsdp2'])
def test_sharded_equals_union(kind, case):
    results = run_distributed(_worker, 2, kind, case, timeout=120)
    sizes, used, _ = CASES[case]
    union = [
        b for rank in (0, 1)
        for i, b in enumerate(_batches(rank, sizes[rank])) if i in used
    ]
    single = _Net()
    captured = bn_inputs(single, union)
    update_bn_stats(single, union, 10**6, progress=False)
    assert_stats(single, captured, 'population')
    expected = _stats(single)
    forwards = {r[2] for r in results}
    assert len(forwards) == 1  # the same forwards on every rank
    for stats, num_batches, _, num_samples in results:
        assert num_batches == 2 * len(used)
        assert num_samples == sum(len(b) for b in union)
        for key, val in stats.items():
            np.testing.assert_allclose(
                val, expected[key], rtol=1e-6, atol=1e-7, err_msg=key)
            assert np.array_equal(val, results[0][0][key])


def _worker_fail(rank, world_size, kind):
    model = _Net()
    sharded = _shard(model, kind)
    inner = sharded.module if kind == 'fsdp' else sharded
    before = copy.deepcopy(_stats(inner))
    batches = _batches(rank, [6, 6, 6])
    if rank == 1:
        batches[1] = 'not a batch'  # fails before the forward
    try:
        update_bn_stats(sharded, batches, 10**6, progress=False)
    except Exception as exc:  # noqa: BLE001
        after = _stats(inner)
        assert all(np.array_equal(before[k], after[k]) for k in before)
        return type(exc).__name__, str(exc)
    return None


@pytest.mark.parametrize('kind', ['fsdp', 'fsdp2'])
def test_a_batch_failing_on_one_rank_raises_everywhere(kind):
    results = run_distributed(_worker_fail, 2, kind, timeout=120)
    assert results[0][0] == 'RuntimeError'
    assert 'another rank' in results[0][1]
    assert results[1][0] == 'TypeError'
    assert 'plain nn.Module' in results[1][1]


class _Bomb(nn.Module):
    """Raises on its second call on rank 1 (inside a sharded forward)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank, self.calls = rank, 0

    def forward(self, x):
        self.calls += 1
        if self.rank == 1 and self.calls == 2:
            raise RuntimeError('bomb went off')
        return x


def _worker_bomb(rank, port, kind, results):
    import os

    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=2)
    model = _Net()
    model.block1.add_module('bomb', _Bomb(rank))
    model.block1.forward = lambda x, b=model.block1: b.bomb(
        torch.relu(b.bn(b.conv(x))))
    sharded = _shard(model, kind)
    inner = sharded.module if kind == 'fsdp' else sharded
    before = _stats(inner)
    try:
        update_bn_stats(
            sharded, _batches(rank, [6, 6, 6]), 10**6, progress=False)
    except Exception as exc:  # noqa: BLE001
        after = _stats(inner)
        unchanged = all(np.array_equal(before[k], after[k]) for k in before)
        left = dist.is_initialized()  # the library ends no group
        abort_distributed()  # what the launcher does with the error
        results.put((rank, type(exc).__name__, str(exc), unchanged, left))
    else:
        results.put((rank, None, '', True, dist.is_initialized()))


@pytest.mark.parametrize('kind', ['fsdp', 'fsdp2'])
def test_a_forward_failing_on_one_rank_raises_everywhere(kind):
    """Inside a sharded forward the ranks cannot agree any more: the
    failing rank raises at once and leaves the process groups alone (a
    library never ends them); the launcher's ``abort_distributed`` ends
    them as the error leaves the script, so the other rank fails at once
    instead of waiting in FSDP's all-gather until the group's timeout.
    Own processes: the groups do not survive."""
    import torch.multiprocessing as mp

    from tests.helpers.dist import free_port
    ctx = mp.get_context('spawn')
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker_bomb, args=(rank, port, kind, results))
        for rank in (0, 1)
    ]
    for proc in procs:
        proc.start()
    try:
        got = dict(
            (r[0], r[1:]) for r in (results.get(timeout=240) for _ in procs))
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    for rank in (0, 1):
        name, message, unchanged, initialised = got[rank]
        assert name == 'RuntimeError', (rank, message)
        assert 'a forward of the sharded model failed' in message
        assert unchanged and initialised
    assert 'bomb went off' in got[1][1]
