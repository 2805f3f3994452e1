"""StatsCollectorHook in real mmengine Runners (1 and 2 gloo processes):
every published number is checked against the per-iteration losses, with
the iterations it covers."""
import math
import os.path as osp
import re
import time

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner

from mmstats import report
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, read_scalars, toy_cfg


# ------------------------------------------------------------ real Runners
@ROOT_HOOKS.register_module(force=True)
class LossRecorderHook(Hook):
    """Keep every training loss this rank computed (and poison one)."""
    priority = 'ABOVE_NORMAL'  # before StatsCollectorHook

    # three more names, as the digits demo reports (5 with the loss and
    # model/feat_norm): x * loss for x in 0..3 per iteration
    DEMO_NAMES = ('model/logit_margin', 'model/confidence', 'model/p_true')

    def __init__(self,
                 nan_at=None,
                 nan_rank=1,
                 sleep_rank=None,
                 demo_names=False):
        self.losses = []
        self.nan_at, self.nan_rank = nan_at, nan_rank
        self.sleep_rank = sleep_rank
        self.demo_names = demo_names

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        from mmengine.dist import get_rank
        if get_rank() == self.sleep_rank:  # a slow data loader
            time.sleep(0.05)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        from mmengine.dist import get_rank
        if runner.iter == self.nan_at and get_rank() == self.nan_rank:
            outputs['loss'] = torch.tensor(math.nan)
        self.losses.append(float(outputs['loss'].detach()))
        if self.demo_names:
            for name in self.DEMO_NAMES:
                report(name, torch.arange(4.) * outputs['loss'].detach())


def recorder(runner) -> LossRecorderHook:
    return [h for h in runner.hooks if isinstance(h, LossRecorderHook)][0]


def test_real_runner_23_iteration_epochs(tmp_path, clean_mmengine):
    """Every published loss statistic covers exactly its iterations."""
    cfg = toy_cfg(
        tmp_path, num_samples=23 * 16 - 5, log_interval=10, report_stats=True)
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook'),
        dict(type='LossRecorderHook', demo_names=True)
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = np.array(recorder(runner).losses)
    assert len(losses) == 46
    scalars = read_scalars(runner)
    steps = sorted(s for s, r in scalars.items() if 'stats/loss/mean' in r)
    assert steps == [10, 20, 23, 33, 43, 46]
    start = 0
    for step in steps:
        window, record = losses[start:step], scalars[step]
        for stat, ref in (('mean', window.mean()), ('std', window.std()),
                          ('min', window.min()), ('max', window.max())):
            np.testing.assert_allclose(
                record[f'stats/loss/{stat}'],
                ref,
                rtol=1e-6,
                err_msg=f'{step} {stat}')
        assert 'stats/model/feat_norm/std' in record
        margins = np.outer(window, np.arange(4.))  # what the hook reported
        np.testing.assert_allclose(
            record['stats/model/p_true/std'], margins.std(), rtol=1e-6)
        start = step
    # LoggerHook's lines (ignore_last: none at 23, 46) carry the short keys
    assert sorted(s for s, r in scalars.items()
                  if 'loss/mean' in r) == [10, 20, 33, 43]
    for step in (10, 20, 33, 43):
        assert scalars[step]['loss/mean'] == pytest.approx(
            scalars[step]['stats/loss/mean'], rel=1e-6)
    # the text line [2][10/23] (iteration 33) shows iterations 24-33
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    line = [ln for ln in log.splitlines() if '[2][10/23]' in ln][0]
    line = line[line.index('Epoch(train)'):]
    shown = float(line.split('  loss/mean: ')[1].split()[0])
    assert shown == pytest.approx(losses[23:33].mean(), abs=1e-4)
    assert 'loss/std' not in line  # compact text; json has all
    for name in ('model/feat_norm', ) + LossRecorderHook.DEMO_NAMES:
        assert f'  {name}/mean: ' in line
    assert len(line) < 300, line  # 5 names and the timing maxima
    # the maxima over ranks follow rank 0's time, data_time (and loss)
    assert re.search(
        r'  time: \S+  data_time: \S+  loss: \S+  '
        r'time/max: \S+  data_time/max: ', line), line
    # the max over ranks (1 here) of 10 iteration times >= their mean
    time_mean = float(line.split('  time: ')[1].split()[0])
    time_max = float(line.split('  time/max: ')[1].split()[0])
    assert time_max >= time_mean
    assert time_max == pytest.approx(scalars[33]['stats/time/max'], abs=1e-4)


def test_real_runner_by_epoch(tmp_path, clean_mmengine):
    cfg = toy_cfg(tmp_path, num_samples=23 * 16 - 5, log_interval=10)
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', by_epoch=True),
        dict(type='LossRecorderHook')
    ]
    cfg.log_processor = dict(by_epoch=True, num_digits=3)
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = np.array(recorder(runner).losses)
    scalars = read_scalars(runner)
    for epoch in (1, 2):
        np.testing.assert_allclose(
            scalars[epoch]['stats/loss/mean'],
            losses[23 * (epoch - 1):23 * epoch].mean(),
            rtol=1e-6)
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    line = [ln for ln in log.splitlines() if 'Epoch(train) [2]  ' in ln][0]
    # LogProcessor's number format (num_digits=3), values of epoch 2
    assert f'  loss/mean: {losses[23:].mean():.3f}' in line
    time_max = line.split('  time/max: ')[1].split()[0]
    assert time_max == f'{scalars[2]["stats/time/max"]:.3f}'
    assert sorted(s for s, r in scalars.items()
                  if 'stats/loss/mean' in r) == [1, 2]  # epochs as steps


def test_real_runner_iteration_based_and_nonfinite_warning(
        tmp_path, clean_mmengine, caplog):
    cfg = toy_cfg(tmp_path, by_epoch=False, max_iters=8, log_interval=4)
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook'),
        dict(type='LossRecorderHook', nan_at=5, nan_rank=0)
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = np.array(recorder(runner).losses)
    scalars = read_scalars(runner)
    assert sorted(s for s, r in scalars.items()
                  if 'stats/loss/mean' in r) == [4, 8]
    np.testing.assert_allclose(
        scalars[8]['stats/loss/mean'], np.nanmean(losses[4:8]), rtol=1e-6)
    assert scalars[8]['stats/loss/nonfinite'] == 1
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert '  loss/nonfinite: 1.0000' in log
    assert log.count('non-finite values at') == 1  # one warning
    # the NaN of iteration 6 (nan_at=5, 0-based) is in the second interval
    assert (
        'non-finite values at iteration 8 (iterations 5-8 since '
        'the previous publication, over all ranks): loss (1 NaN/inf)') in log


def test_nonfinite_warning_names_the_epochs_iterations(tmp_path,
                                                       clean_mmengine):
    """By epoch: the warning names the iterations of the epoch that held
    the NaN (10 per epoch here), counted as the loop counts them."""
    cfg = toy_cfg(tmp_path, by_epoch=True, max_epochs=2, log_interval=4)
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', by_epoch=True),
        dict(type='LossRecorderHook', nan_at=15, nan_rank=0)
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert len(recorder(runner).losses) == 20
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert log.count('non-finite values at') == 1
    assert ('non-finite values at iteration 20 (iterations 11-20 '
            'since the previous publication, over all ranks): loss') in log


def test_tensorboard_backend_records_the_statistics(tmp_path, clean_mmengine):
    pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=4,
        log_interval=2,
        visualizer=dict(
            type='Visualizer',
            vis_backends=[dict(type='TensorboardVisBackend')]))
    cfg.custom_hooks = [dict(type='mmstats.StatsCollectorHook')]
    runner = Runner.from_cfg(cfg)
    runner.train()
    runner.visualizer.close()
    events = EventAccumulator(osp.join(runner.log_dir, 'vis_data')).Reload()
    for tag in ('stats/loss/mean', 'stats/loss/max'):
        assert [e.step for e in events.Scalars(tag)] == [2, 4]


# ------------------------------------------------------------ distributed
def _train_rank(rank, world_size, work_dir, hook_args, on_nonfinite='warn'):
    cfg = gloo_launch(
        toy_cfg(work_dir, by_epoch=False, max_iters=6, log_interval=3))
    cfg.custom_hooks = [
        dict(
            type='mmstats.StatsCollectorHook',
            health=dict(on_nonfinite=on_nonfinite),
            hub_regex='.*'),
        dict(type='LossRecorderHook', **hook_args)
    ]
    runner = Runner.from_cfg(cfg)
    try:
        runner.train()
    except FloatingPointError as e:
        return dict(raised=str(e), iter=runner.iter)
    hub = runner.message_hub
    return dict(
        losses=recorder(runner).losses,
        mean=list(hub.log_scalars['stats/loss/mean'].data[0]),
        max=list(hub.log_scalars['stats/loss/max'].data[0]),
        time_max=hub.get_scalar('stats/time/max').current(),
        data_time_max=hub.get_scalar('stats/data_time/max').current(),
        slowest=hub.get_scalar('stats/data_time/slowest_rank').current())


def test_two_ranks_log_the_all_rank_statistics_and_the_slowest_rank(tmp_path):
    results = run_distributed(
        _train_rank, 2, str(tmp_path), dict(sleep_rank=1), timeout=240)
    assert results[0]['mean'] == results[1]['mean']
    assert results[0]['max'] == results[1]['max']
    losses = np.array([r['losses'] for r in results])  # (rank, iter)
    for window, (mean,
                 mx) in enumerate(zip(results[0]['mean'], results[0]['max'])):
        values = losses[:, 3 * window:3 * window + 3]
        np.testing.assert_allclose(mean, values.mean(), rtol=1e-6)
        np.testing.assert_allclose(mx, values.max(), rtol=1e-6)
    assert not np.allclose(losses[0], losses[1])  # ranks really differ
    assert results[0]['slowest'] == results[1]['slowest'] == 1
    assert results[0]['data_time_max'] >= 0.05  # rank 1's sleep
    assert results[0]['time_max'] >= 0.05


def test_nan_on_one_rank_raises_on_every_rank_at_the_same_iteration(tmp_path):
    results = run_distributed(
        _train_rank,
        2,
        str(tmp_path),
        dict(nan_at=4, nan_rank=1),
        'raise',
        timeout=240)
    for result in results:
        assert 'iteration 6' in result['raised']
        assert 'loss (1 NaN/inf)' in result['raised']
    assert results[0]['iter'] == results[1]['iter']


def _train_rank_by_epoch(rank, world_size, work_dir):
    # 80 samples: 40 per rank, 3 iterations of 16, 16, 8 per epoch
    cfg = gloo_launch(toy_cfg(work_dir, num_samples=80, log_interval=2))
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook'),
        dict(type='LossRecorderHook')
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    return dict(
        losses=recorder(runner).losses,
        scalars=read_scalars(runner) if rank == 0 else None)


def test_two_ranks_epoch_based_publications_cover_their_iterations(tmp_path):
    results = run_distributed(
        _train_rank_by_epoch, 2, str(tmp_path), timeout=240)
    losses = np.array([r['losses'] for r in results])  # (rank, iter)
    assert losses.shape == (2, 6)
    scalars = results[0]['scalars']
    steps = sorted(s for s, r in scalars.items() if 'stats/loss/mean' in r)
    assert steps == [2, 3, 5, 6]  # inner iteration 2 and epoch ends
    start = 0
    for step in steps:
        window = losses[:, start:step]
        np.testing.assert_allclose(
            scalars[step]['stats/loss/mean'], window.mean(), rtol=1e-6)
        np.testing.assert_allclose(
            scalars[step]['stats/loss/std'], window.std(), rtol=1e-5)
        start = step
    assert not np.allclose(losses[0], losses[1])
    assert sorted(s for s, r in scalars.items() if 'loss/mean' in r) == [2, 5]


def _slowest(rank, world_size, cases):
    from mmstats.dist import slowest_rank
    return [slowest_rank(seconds[rank]) for seconds in cases]


def test_slowest_rank_agrees_on_every_rank_ties_go_to_the_lowest():
    from mmstats.dist import slowest_rank
    assert slowest_rank(1.0) is None  # not distributed
    cases = [(0.1, 0.3, 0.2), (5.0, 0.0, 5.0), (0.0, 0.0, 0.0),
             (1e-6, 2e-6, 0.0), (3600.0, 3599.999999, 0.5)]
    results = run_distributed(_slowest, 3, cases, timeout=120)
    expected = [int(np.argmax(seconds)) for seconds in cases]
    assert results == [expected] * 3


@ROOT_HOOKS.register_module(force=True)
class BatchIdsHook(Hook):
    """Keep the sample indices of every training batch."""

    def __init__(self):
        self.ids = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.ids.append(data_batch['data_samples']['img_id'].tolist())


def test_values_reported_in_dataloader_workers(tmp_path, clean_mmengine):
    """The dataset reports each sample's index in 2 worker processes; each
    publication counts exactly the samples of its iterations."""
    loader = dict(
        num_workers=2,
        persistent_workers=False,
        dataset=dict(
            type='ToyDataset', num_samples=24, report_name='data/idx'))
    cfg = toy_cfg(tmp_path, num_samples=24, batch_size=4, log_interval=4)
    cfg.train_dataloader.update(loader)
    cfg.val_dataloader.update(loader, batch_size=8)
    cfg.val_dataloader.dataset.num_samples = 16
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', stats=('num', 'mean')),
        dict(type='BatchIdsHook')
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    ids = [h for h in runner.hooks if isinstance(h, BatchIdsHook)][0].ids
    assert len(ids) == 12  # 2 epochs of 6 iterations
    scalars = read_scalars(runner)
    steps = sorted(s for s, r in scalars.items() if 'stats/data/idx/num' in r)
    assert steps == [4, 6, 10, 12]
    start = 0
    for step in steps:
        window = np.concatenate(ids[start:step])
        assert scalars[step]['stats/data/idx/num'] == len(window)
        assert scalars[step]['stats/data/idx/mean'] == pytest.approx(
            window.mean(), rel=1e-12)
        start = step
    for epoch in (1, 2):  # every validation sample once, by the epoch
        assert scalars[epoch]['stats/val/data/idx/num'] == 16
        assert scalars[epoch]['stats/val/data/idx/mean'] == 7.5
