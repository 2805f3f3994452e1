"""The shared test helpers do what the other tests rely on."""
import os
import os.path as osp
import time

import pytest
import torch
import torch.distributed as dist
from mmengine.logging import MessageHub
from mmengine.runner import Runner

from mmstats import Collector, report
from tests.helpers.dist import pool_pids, run_distributed
from tests.helpers.runner import toy_cfg
from tests.helpers.toy import ToyDataset


def _leak_state(rank, world_size):
    """A task that leaves every kind of global state behind."""
    c = Collector()  # noqa: F841  (alive while reporting)
    report('leaked', float(rank))  # a pending value, never collected
    MessageHub.get_instance('leaky').update_scalar('x', 1.)
    os.environ['MMSTATS_LEAK'] = '1'
    torch.manual_seed(1234 + rank)
    return os.getpid()


def _inspect(rank, world_size):
    c = Collector()
    report('fresh', float(rank))
    c.update()
    hash_seed = os.environ.get('PYTHONHASHSEED')
    return dict(
        pid=os.getpid(),
        hash_seed=hash_seed,
        str_hash=hash('mmstats'),
        set_order=list({'loss', 'acc', 'time', 'grad_norm', 'lr',
                        'data_time'}),
        names=c.names(),
        count=c.num('fresh'),
        leaked_hub='leaky' in MessageHub._instance_dict,
        leaked_env=os.environ.get('MMSTATS_LEAK'),
        # an unseeded draw is what a fresh process would draw
        draw=torch.rand(1).item(),
        seed=torch.initial_seed(),
        world=dist.get_world_size(),
        rank=dist.get_rank())


def _fail(rank, world_size):
    if rank == 1:
        raise ValueError('rank one broke')
    return rank


def _hang(rank, world_size):
    if rank == 0:
        time.sleep(600)  # never answers: a hung collective looks the same
    return rank


def test_run_distributed_pool_isolation_failures_and_hangs():
    """One pool of spawned gloo ranks serves every call and world size:
    per-rank hash seeds, state reset between tasks, a failing or hanging
    task fails its own call only and the next call gets fresh ranks."""
    before = os.environ.get('PYTHONHASHSEED')
    pids = run_distributed(_leak_state, 2)
    assert [pool_pids()[rank] for rank in (0, 1)] == pids  # pooled ranks
    res = run_distributed(_inspect, 2)
    assert [r['pid'] for r in res] == pids  # reused, not respawned
    assert [r['rank'] for r in res] == [0, 1]
    assert [r['world'] for r in res] == [2, 2]
    # each rank has its own hash seed, fixed when it started
    assert [r['hash_seed'] for r in res] == ['1', '2']
    assert res[0]['str_hash'] != res[1]['str_hash']
    assert os.environ.get('PYTHONHASHSEED') == before  # parent untouched
    # nothing the last task left behind is visible to the next one
    assert res[0]['count'] == 2  # one value per rank, not the leaked ones
    assert 'leaked' not in res[0]['names']
    assert not res[0]['leaked_hub'] and res[0]['leaked_env'] is None
    for r in res:
        fresh = torch.Generator().manual_seed(r['seed'])
        assert r['draw'] == torch.rand(1, generator=fresh).item()
    # another world size: the same processes in a new group, one more rank
    three = run_distributed(_inspect, 3)
    assert [r['pid'] for r in three[:2]] == pids
    expected = [(0, 3, 3), (1, 3, 3), (2, 3, 3)]  # rank, world, count
    assert [(r['rank'], r['world'], r['count']) for r in three] == expected
    assert three[2]['hash_seed'] == '3'

    # a failing rank: its traceback, and its call's ranks are replaced
    with pytest.raises(RuntimeError, match='(?s)rank 1 failed.*rank one'):
        run_distributed(_fail, 2)
    assert 0 not in pool_pids() and 1 not in pool_pids()
    assert pool_pids()[2] == three[2]['pid']
    again = run_distributed(_inspect, 2)
    assert [r['hash_seed'] for r in again] == ['1', '2']
    assert set(r['pid'] for r in again).isdisjoint(pids)

    # a hang: TimeoutError naming the finished ranks, then fresh ranks
    # (the rank left out keeps its process and joins the new group)
    with pytest.raises(TimeoutError, match=r'finished ranks: \[1\]'):
        run_distributed(_hang, 2, timeout=3)
    after = run_distributed(_inspect, 3)
    expected = [(0, 3, 3), (1, 3, 3), (2, 3, 3)]  # rank, world, count
    assert [(r['rank'], r['world'], r['count']) for r in after] == expected
    assert after[2]['pid'] == three[2]['pid']
    assert after[0]['pid'] not in (pids[0], again[0]['pid'])


def test_toy_dataset_is_deterministic_and_collatable():
    first, again = ToyDataset(23), ToyDataset(23)
    assert len(first) == 23
    assert torch.equal(first.images, again.images)
    sample = first[13]
    assert sample['inputs'].shape == (1, 8, 8)
    assert sample['data_samples'] == dict(gt_label=3, img_id=13)


@pytest.mark.parametrize('by_epoch', [True, False])
def test_toy_runner_epoch_length_and_validation(tmp_path, clean_mmengine,
                                                by_epoch):
    # 23 iterations per epoch: 45 samples in batches of 2 (the last has 1)
    cfg = toy_cfg(
        tmp_path,
        by_epoch=by_epoch,
        num_samples=45,
        batch_size=2,
        max_epochs=1,
        max_iters=23,
        log_interval=5)
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 23
    assert runner.epoch == (1 if by_epoch else 0)
    acc = runner.message_hub.get_scalar('val/accuracy').current()
    assert 0 <= acc <= 100
    name = 'epoch_1.pth' if by_epoch else 'iter_23.pth'
    assert osp.exists(osp.join(tmp_path, name))  # CheckpointHook.save_last
