"""StatsCollectorHook: interval logic (mocked Runner) and real Runners."""
import json
import os.path as osp
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner

from mmstats import report
from mmstats.hooks import StatsCollectorHook
from mmstats.registry import HOOKS
from tests.helpers.dist import run_distributed
from tests.runner_utils import EPOCH_CONFIG, ITER_CONFIG, small_cfg


@pytest.mark.parametrize('kwargs, match', [
    (dict(interval=0), 'interval must be None'),
    (dict(interval=2.5), 'interval must be None'),
    (dict(by_epoch='no'), 'by_epoch must be a bool'),
    (dict(stats=('mean', 'median')), 'stats must be a non-empty list'),
    (dict(stats='mean'), 'stats must be a non-empty list'),
    (dict(regex='(unclosed'), 'is not a valid regular expression'),
    (dict(prefix=''), 'prefix must be a non-empty str'),
])
def test_invalid_arguments_fail_when_the_hook_is_built(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        HOOKS.build(dict(type='StatsCollectorHook', **kwargs))


def test_registered_and_runs_before_the_logger_hook():
    from mmengine.hooks import LoggerHook
    from mmengine.runner.priority import get_priority
    hook = HOOKS.build(dict(type='mmstats.StatsCollectorHook'))
    assert get_priority(hook.priority) < get_priority(LoggerHook.priority)
    assert ROOT_HOOKS.get('StatsCollectorHook') is StatsCollectorHook


def mock_runner(logger_interval=None):
    runner = MagicMock()
    runner.hooks = []
    if logger_interval:
        from mmengine.hooks import LoggerHook
        runner.hooks = [LoggerHook(interval=logger_interval)]
    published = {}
    runner.message_hub.update_scalar.side_effect = \
        lambda key, value: published.setdefault(key, []).append(
            (runner.iter, value))
    return runner, published


@pytest.mark.parametrize('interval, logger_interval, expected_iters', [
    (None, 4, [3, 7, 11]),
    (5, 4, [4, 9]),
    (None, None, [9]),  # no LoggerHook: every 10 iterations
])
def test_interval_logic_and_window_statistics(interval, logger_interval,
                                              expected_iters):
    hook = StatsCollectorHook(interval=interval, collect_outputs=False)
    runner, published = mock_runner(logger_interval)
    hook.before_run(runner)
    values = []
    for it in range(12):
        runner.iter = it
        report('x', float(it))
        values.append(float(it))
        hook.after_train_iter(runner, it)
    means = published['train/stats/x/mean']
    assert [it for it, _ in means] == expected_iters
    start = 0
    for it, mean in means:  # each window holds exactly its iterations
        np.testing.assert_allclose(mean, np.mean(values[start:it + 1]),
                                   rtol=1e-12)
        start = it + 1


def test_collect_outputs_reports_train_step_losses():
    hook = StatsCollectorHook(interval=2, stats=('mean', 'num'))
    runner, published = mock_runner()
    hook.before_run(runner)
    losses = [0.5, 1.5]
    for it, loss in enumerate(losses):
        runner.iter = it
        hook.after_train_iter(runner, it,
                              outputs=dict(loss=torch.tensor(loss)))
    assert published['train/stats/loss/mean'] == [(1, 1.0)]
    assert published['train/stats/loss/num'] == [(1, 2.0)]


def test_by_epoch_publishes_one_summary_per_epoch_with_epoch_step():
    hook = StatsCollectorHook(by_epoch=True, collect_outputs=False,
                              stats=('max', ))
    runner, published = mock_runner(logger_interval=1)
    hook.before_run(runner)
    for epoch in range(2):
        runner.epoch = epoch
        for it in range(3):
            runner.iter = epoch * 3 + it
            report('y', float(runner.iter))
            hook.after_train_iter(runner, it)
        hook.after_train_epoch(runner)
    assert published == {'stats/y/max': [(2, 2.0), (5, 5.0)]}
    steps = [c.kwargs['step'] for c in
             runner.visualizer.add_scalars.call_args_list]
    assert steps == [1, 2]


def test_values_reported_during_validation_are_kept_apart():
    hook = StatsCollectorHook(interval=1, collect_outputs=False,
                              stats=('mean', ))
    runner, published = mock_runner()
    hook.before_run(runner)
    runner.iter = 0
    report('z', 1.0)
    hook.before_val_epoch(runner)
    report('z', 100.0)
    hook.after_val_epoch(runner)
    hook.after_train_iter(runner, 0)
    assert published['val/stats/val/z/mean'] == [(0, 100.0)]
    assert published['train/stats/z/mean'] == [(0, 1.0)]


# ------------------------------------------------------------ real Runners
@ROOT_HOOKS.register_module(force=True)
class LossRecorderHook(Hook):
    """Keep every training loss this rank computed."""
    priority = 'LOWEST'

    def __init__(self):
        self.losses = []

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.losses.append(float(outputs['loss'].detach()))


def stats_cfg(config, work_dir, hook=None, **overrides):
    cfg = small_cfg(config, work_dir, **overrides)
    cfg.model.report_stats = True
    cfg.custom_hooks = [dict(type='StatsCollectorHook', **(hook or {}))]
    return cfg


def read_scalars(runner):
    path = osp.join(runner.log_dir, 'vis_data', 'scalars.json')
    return [json.loads(line) for line in open(path)]


def test_real_runner_logs_statistics_to_log_and_scalars_json(
        tmp_path, clean_mmengine):
    cfg = stats_cfg(ITER_CONFIG, tmp_path,
                    train_cfg=dict(max_iters=8, val_interval=4),
                    param_scheduler=[dict(type='ConstantLR', factor=1.0,
                                          by_epoch=False)],
                    default_hooks=dict(logger=dict(interval=4),
                                       checkpoint=dict(interval=100)))
    cfg.custom_hooks.append(dict(type='LossRecorderHook'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    scalars = read_scalars(runner)
    train = [s for s in scalars if 'iter' in s]
    assert [s['step'] for s in train] == [4, 8]
    # each logged line holds its own window's exact statistics (LogProcessor
    # would otherwise average 'loss' keys over past intervals)
    recorder, = [h for h in runner.hooks if isinstance(h, LossRecorderHook)]
    losses = np.array(recorder.losses)
    for s, window in zip(train, (losses[:4], losses[4:8])):
        for stat, ref in (('mean', window.mean()), ('std', window.std()),
                          ('min', window.min()), ('max', window.max())):
            np.testing.assert_allclose(s[f'stats/loss/{stat}'], ref,
                                       rtol=1e-6, err_msg=stat)
    for key in ('stats/loss/mean', 'stats/loss/std', 'stats/loss/min',
                'stats/loss/max', 'stats/model/feat_norm/mean',
                'stats/model/logit_margin/max', 'stats/model/p_true/min'):
        assert all(key in s for s in train), key
    for s in train:
        assert s['stats/loss/min'] <= s['stats/loss/mean'] <= \
            s['stats/loss/max']
        assert 0 <= s['stats/model/p_true/min'] <= 1
    val = [s for s in scalars if 'accuracy' in s]
    assert len(val) == 2
    assert all('stats/val/model/confidence/mean' in s for s in val)
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert 'stats/loss/mean:' in log
    assert 'stats/val/model/feat_norm/mean:' in log


def test_real_runner_by_epoch(tmp_path, clean_mmengine):
    cfg = stats_cfg(EPOCH_CONFIG, tmp_path, hook=dict(by_epoch=True),
                    train_cfg=dict(max_epochs=2))
    runner = Runner.from_cfg(cfg)
    runner.train()
    summaries = [s for s in read_scalars(runner)
                 if 'stats/loss/mean' in s and 'iter' not in s]
    assert [s['step'] for s in summaries] == [1, 2]
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert 'Epoch(train) [2] stats/loss/mean:' in log


def test_tensorboard_backend_records_the_statistics(tmp_path,
                                                    clean_mmengine):
    pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    cfg = stats_cfg(ITER_CONFIG, tmp_path,
                    train_cfg=dict(max_iters=4, val_interval=4),
                    param_scheduler=[dict(type='ConstantLR', factor=1.0,
                                          by_epoch=False)],
                    default_hooks=dict(logger=dict(interval=2),
                                       checkpoint=dict(interval=100)))
    cfg.visualizer.vis_backends = [dict(type='TensorboardVisBackend')]
    runner = Runner.from_cfg(cfg)
    runner.train()
    runner.visualizer.close()
    events = EventAccumulator(
        osp.join(runner.log_dir, 'vis_data')).Reload()
    tags = events.Tags()['scalars']
    assert 'stats/loss/mean' in tags
    assert [e.step for e in events.Scalars('stats/loss/mean')] == [2, 4]


# ------------------------------------------------------------ distributed
def _train_rank(rank, world_size, work_dir):
    from mmstats.utils import setup_launcher
    cfg = stats_cfg(ITER_CONFIG, work_dir,
                    train_cfg=dict(max_iters=6, val_interval=100),
                    param_scheduler=[dict(type='ConstantLR', factor=1.0,
                                          by_epoch=False)],
                    default_hooks=dict(logger=dict(interval=3),
                                       checkpoint=dict(interval=100)))
    cfg.custom_hooks.append(dict(type='LossRecorderHook'))
    cfg.launcher = 'pytorch'
    setup_launcher(cfg)
    runner = Runner.from_cfg(cfg)
    runner.train()
    recorder = [h for h in runner.hooks if isinstance(h, LossRecorderHook)]
    hub = runner.message_hub.log_scalars
    return dict(losses=recorder[0].losses,
                mean=list(hub['train/stats/loss/mean'].data[0]),
                max=list(hub['train/stats/loss/max'].data[0]))


def test_two_ranks_log_the_all_rank_loss_statistics(tmp_path):
    results = run_distributed(_train_rank, 2, str(tmp_path), timeout=240)
    assert results[0]['mean'] == results[1]['mean']
    assert results[0]['max'] == results[1]['max']
    losses = np.array([r['losses'] for r in results])  # (rank, iter)
    for window, (mean, mx) in enumerate(zip(results[0]['mean'],
                                            results[0]['max'])):
        values = losses[:, 3 * window:3 * window + 3]
        np.testing.assert_allclose(mean, values.mean(), rtol=1e-6)
        np.testing.assert_allclose(mx, values.max(), rtol=1e-6)
    assert not np.allclose(losses[0], losses[1])  # ranks really differ
