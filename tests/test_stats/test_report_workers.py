"""report() in DataLoader workers (Dataset.__getitem__ and a transform):
every value of every consumed batch counted once, through real Runners."""
import math
import multiprocessing

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS
from mmengine.runner import Runner

from mmstats.publish.worker_loaders import enable_worker_reporting
from mmstats.stats import Collector, phase, report
from mmstats.stats.workers import deliver_worker_reports
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, toy_cfg
from tests.helpers.toy import ToyDataset


class AddNoise:
    """A transform that reports the input's sum, then changes the input."""

    def __call__(self, sample: dict) -> dict:
        report('data/pix', float(sample['inputs'].double().sum()))
        sample['inputs'] = sample['inputs'] + 0.0
        return sample


@DATASETS.register_module(force=True)
class TransformedToyDataset(ToyDataset):
    """ToyDataset whose ``__getitem__`` reports ``data/idx`` and whose
    transform reports ``data/pix``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(report_name='data/idx', **kwargs)
        self.transform = AddNoise()

    def __getitem__(self, idx: int) -> dict:
        return self.transform(super().__getitem__(idx))


@HOOKS.register_module(force=True)
class WorkerReportsHook(Hook):
    """Calls enable/deliver like StatsCollectorHook and records, per train
    iteration, the batch's indices / pixel sum and the collector's view."""
    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self.train = Collector(r'data/.*', keep_previous=False)
        self.val = Collector(r'val/data/.*', keep_previous=False)
        self.records, self.val_idx = [], []

    def before_train(self, runner) -> None:
        enable_worker_reporting(runner)

    def before_val(self, runner) -> None:
        enable_worker_reporting(runner)
        phase('val')
        self.val_idx = []

    def after_val(self, runner) -> None:
        self.val.update()
        phase(None)
        self.val_result = (self.val.num('val/data/idx'),
                           self.val.num('val/data/idx') *
                           self.val.mean('val/data/idx'))

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        deliver_worker_reports(data_batch)
        deliver_worker_reports(data_batch)  # a second call adds nothing
        self.batch = (data_batch['data_samples']['img_id'].tolist(),
                      float(data_batch['inputs'].double().sum()))

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        deliver_worker_reports(data_batch)
        self.val_idx += data_batch['data_samples']['img_id'].tolist()

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.train.update()
        got = {
            name: (self.train.num(name),
                   self.train.num(name) * self.train.mean(name))
            for name in ('data/idx', 'data/pix')
        }
        self.records.append((self.batch, got))


def _train(work_dir, by_epoch, num_workers, persistent, launch=False):
    loader = dict(
        num_workers=num_workers,
        persistent_workers=persistent,
        dataset=dict(type='TransformedToyDataset', num_samples=24))
    cfg = toy_cfg(
        work_dir,
        by_epoch=by_epoch,
        num_samples=24,
        batch_size=4,
        max_epochs=2,
        max_iters=8)
    cfg.train_dataloader.update(loader)
    cfg.val_dataloader.update(loader, batch_size=8)
    cfg.val_dataloader.dataset.num_samples = 16
    cfg.custom_hooks = [dict(type='WorkerReportsHook')]
    if launch:
        gloo_launch(cfg)
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = [h for h in runner.hooks if isinstance(h, WorkerReportsHook)][0]
    return hook.records, hook.val_idx, hook.val_result


def _check_one_rank(records, val_idx, val_result, iters):
    assert len(records) == iters
    for (idx, pix), got in records:
        assert got['data/idx'][0] == len(idx)
        assert got['data/idx'][1] == pytest.approx(sum(idx), rel=1e-12)
        assert got['data/pix'][0] == len(idx)
        assert got['data/pix'][1] == pytest.approx(pix, rel=1e-9)
    assert val_result[0] == len(val_idx) == 16
    assert val_result[1] == pytest.approx(sum(val_idx), rel=1e-12)


@pytest.mark.parametrize('by_epoch,num_workers,persistent', [
    (True, 0, False),
    (True, 2, False),
    (True, 2, True),
    (False, 2, False),
    (False, 2, True),
])
def test_worker_values_counted_once(tmp_path, by_epoch, num_workers,
                                    persistent):
    records, val_idx, val_result = _train(tmp_path, by_epoch, num_workers,
                                          persistent)
    _check_one_rank(records, val_idx, val_result, 12 if by_epoch else 8)


def _rank_train(rank, world_size, work_dir, by_epoch):
    # run_distributed's ranks are daemonic processes, which multiprocessing
    # forbids to start DataLoader workers; the parent still reaps them.
    multiprocessing.current_process()._config['daemon'] = False
    torch.manual_seed(rank)
    records, val_idx, val_result = _train(
        f'{work_dir}/r{rank}', by_epoch, 2, True, launch=True)
    return records, val_idx, val_result


@pytest.mark.parametrize('by_epoch', [True, False])
def test_worker_values_two_ranks(tmp_path, by_epoch):
    results = run_distributed(
        _rank_train, 2, str(tmp_path), by_epoch, timeout=240)
    (rec0, val0, res0), (rec1, val1, res1) = results
    assert len(rec0) == len(rec1) == (6 if by_epoch else 8)
    for ((idx0, pix0), got0), ((idx1, pix1), got1) in zip(rec0, rec1):
        assert got0 == got1  # every rank publishes the same numbers
        assert got0['data/idx'][0] == len(idx0) + len(idx1)
        assert got0['data/idx'][1] == pytest.approx(
            sum(idx0) + sum(idx1), rel=1e-12)
        assert got0['data/pix'][1] == pytest.approx(pix0 + pix1, rel=1e-9)
    assert res0 == res1
    assert res0[0] == len(val0) + len(val1) == 16
    assert res0[1] == pytest.approx(sum(val0) + sum(val1), rel=1e-12)
    assert not math.isnan(res0[1])


def tuple_collate(samples):
    """A collate_fn that returns a tuple (inputs, data_samples)."""
    from mmengine.dataset import default_collate
    batch = default_collate(samples)
    return batch['inputs'], batch['data_samples']


def test_batches_that_cannot_carry_worker_values_warn_once(
        tmp_path, clean_mmengine):
    import glob

    from mmengine.registry import FUNCTIONS
    FUNCTIONS.register_module(
        'tuple_collate', module=tuple_collate, force=True)
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        num_samples=24,
        batch_size=4,
        max_iters=6,
        log_interval=2)
    cfg.train_dataloader.update(
        num_workers=1,
        collate_fn=dict(type='tuple_collate'),
        dataset=dict(type='TransformedToyDataset', num_samples=24))
    cfg.custom_hooks = [dict(type='mmstats.StatsCollectorHook')]
    runner = Runner.from_cfg(cfg)
    runner.train()
    log = open(glob.glob(f'{runner.log_dir}/*.log')[0]).read()
    assert log.count('cannot ride with batches of type tuple') == 1
