"""The shared test helpers do what the other tests rely on."""
import os
import os.path as osp

import pytest
import torch
from mmengine.runner import Runner

from tests.helpers.dist import run_distributed
from tests.helpers.runner import toy_cfg
from tests.helpers.toy import ToyDataset


def _hash_seed(rank, world_size):
    return os.environ.get('PYTHONHASHSEED'), hash('mmstats'), list(
        {'loss', 'acc', 'time', 'grad_norm', 'lr', 'data_time'})


def test_each_rank_has_its_own_hash_seed():
    before = os.environ.get('PYTHONHASHSEED')
    results = run_distributed(_hash_seed, 2)
    assert [seed for seed, _, _ in results] == ['1', '2']
    assert results[0][1] != results[1][1]  # str hashes differ per rank
    assert os.environ.get('PYTHONHASHSEED') == before  # parent untouched


def _fail(rank, world_size):
    if rank == 1:
        raise ValueError('rank one broke')
    return rank


def test_a_failing_rank_fails_the_call_with_its_traceback():
    with pytest.raises(RuntimeError, match='(?s)rank 1 failed.*rank one'):
        run_distributed(_fail, 2)


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
