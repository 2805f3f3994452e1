"""PreciseBNHook: interval logic (mocked Runner) and real Runners."""
import copy
import json
import os.path as osp
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner

from mmstats.hooks import PreciseBNHook
from mmstats.registry import HOOKS
from tests.helpers.dist import run_distributed
from tests.helpers.record_batches_hook import read_batches
from tests.runner_utils import EPOCH_CONFIG, ITER_CONFIG, small_cfg

SUMMARY = dict(num_layers=6, num_samples=64, num_batches=4, seconds=0.1,
               var_change=0.05, mean_change=0.01, skipped=[], frozen=[],
               unaffected_norms=[])


# --------------------------------------------------------------- build time
@pytest.mark.parametrize('kwargs, match', [
    (dict(num_samples=0), 'num_samples must be a positive int'),
    (dict(num_samples=10.5), 'num_samples must be a positive int'),
    (dict(interval=0), 'interval must be a positive int'),
    (dict(by_epoch='yes'), 'by_epoch must be None'),
    (dict(estimator='ema'), 'estimator must be one of'),
    (dict(dataloader='train'), 'dataloader must be None or a'),
    (dict(at_end=1), 'at_end must be a bool'),
])
def test_invalid_arguments_fail_when_the_hook_is_built(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        HOOKS.build(dict(type='PreciseBNHook', **kwargs))


def test_registered_with_priority_above_normal():
    hook = HOOKS.build(dict(type='mmstats.PreciseBNHook'))
    assert isinstance(hook, PreciseBNHook)
    assert hook.priority == 'ABOVE_NORMAL'
    assert ROOT_HOOKS.get('PreciseBNHook') is PreciseBNHook


# ------------------------------------------------------ mocked-Runner logic
def mock_runner(loop_cls, max_epochs=5, max_iters=50):
    runner = MagicMock()
    runner.train_loop = MagicMock(spec=loop_cls)
    runner.model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    runner.hooks = []
    runner.max_epochs, runner.max_iters = max_epochs, max_iters
    return runner


def fire(hook, runner, loop='epoch', max_epochs=5, max_iters=50):
    """Drive the hook through a whole run; return when it recomputed."""
    calls = []
    with patch('mmstats.hooks.precise_bn_hook.update_bn_stats',
               side_effect=lambda *a, **k: calls.append(
                   (runner.epoch, runner.iter)) or SUMMARY), \
            patch.object(PreciseBNHook, '_build_loader', return_value=[]):
        hook.before_train(runner)
        for it in range(max_iters):
            runner.iter = it
            runner.epoch = it * max_epochs // max_iters
            hook.after_train_iter(runner, it % (max_iters // max_epochs))
            if (it + 1) % (max_iters // max_epochs) == 0:
                hook.after_train_epoch(runner)
    return calls


@pytest.mark.parametrize('kwargs, loop, expected', [
    (dict(), EpochBasedTrainLoop, [(e, e * 10 + 9) for e in range(5)]),
    (dict(interval=2), EpochBasedTrainLoop, [(1, 19), (3, 39), (4, 49)]),
    (dict(interval=2, at_end=False), EpochBasedTrainLoop, [(1, 19),
                                                           (3, 39)]),
    (dict(interval=20), IterBasedTrainLoop, [(1, 19), (3, 39), (4, 49)]),
    (dict(interval=25, at_end=False), IterBasedTrainLoop, [(2, 24),
                                                            (4, 49)]),
    (dict(interval=3, by_epoch=True), IterBasedTrainLoop, [(2, 29),
                                                           (4, 49)]),
    (dict(interval=20, by_epoch=False), EpochBasedTrainLoop,
     [(1, 19), (3, 39), (4, 49)]),
])
def test_interval_logic(kwargs, loop, expected):
    hook = PreciseBNHook(**kwargs)
    runner = mock_runner(loop)
    assert fire(hook, runner) == expected


def test_var_change_goes_to_the_message_hub():
    hook = PreciseBNHook(interval=1)
    runner = mock_runner(EpochBasedTrainLoop)
    fire(hook, runner)
    runner.message_hub.update_scalar.assert_called_with(
        'train/precise_bn/var_change', 0.05)


def test_model_without_batchnorm_makes_the_hook_a_noop():
    hook = PreciseBNHook()
    runner = mock_runner(EpochBasedTrainLoop)
    runner.model = torch.nn.Sequential(torch.nn.GroupNorm(1, 3))
    assert fire(hook, runner) == []


# ------------------------------------------------------------ real Runners
@ROOT_HOOKS.register_module(force=True)
class ValSnapshotHook(Hook):
    """Record what the validation loop evaluates (runs after every other
    before_val_epoch hook, EMAHook's swap included)."""
    priority = 'LOWEST'

    def __init__(self):
        self.snapshots = []

    def before_val_epoch(self, runner):
        model = runner.model.module if hasattr(runner.model,
                                               'module') else runner.model
        stem = model.backbone.stem
        self.snapshots.append(
            dict(weight=stem.conv.weight.detach().clone(),
                 mean=stem.bn.running_mean.clone(),
                 var=stem.bn.running_var.clone()))


def train_inputs(cfg) -> torch.Tensor:
    from mmstats.registry import DATASETS
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    return torch.stack([dataset[i]['inputs'] for i in range(len(dataset))])


def stem_reference(inputs, weight):
    """float64 mean/var over all values that the stem BN sees.

    The stem BN follows a bias-free conv: its inputs do not depend on how
    the data is batched, so this is the exact population statistic."""
    out = F.conv2d(inputs.double(), weight.double(), padding=1)
    return (out.mean(dim=(0, 2, 3)),
            out.var(dim=(0, 2, 3), unbiased=False))


def assert_precise(mean, var, inputs, weight, rtol=1e-4):
    ref_mean, ref_var = stem_reference(inputs, weight)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=rtol,
                               atol=1e-5)
    torch.testing.assert_close(var.double(), ref_var, rtol=rtol, atol=1e-6)


def precise_cfg(config, tmp_path, hook=None, **overrides):
    cfg = small_cfg(config, tmp_path, **overrides)
    # no augmentation: the reference below needs the exact training inputs
    cfg.train_dataloader.dataset.pipeline = cfg.val_dataloader.dataset.pipeline
    cfg.custom_hooks = [
        dict(type='PreciseBNHook', num_samples=10_000, progress=False,
             **(hook or {})),
        dict(type='ValSnapshotHook')
    ]
    return cfg


def val_snapshots(runner):
    return [h for h in runner.hooks if isinstance(h, ValSnapshotHook)
            ][0].snapshots


def test_epoch_runner_validates_with_precise_stats(tmp_path, clean_mmengine):
    cfg = precise_cfg(EPOCH_CONFIG, tmp_path, train_cfg=dict(max_epochs=2))
    runner = Runner.from_cfg(cfg)
    runner.train()
    inputs = train_inputs(cfg)
    snaps = val_snapshots(runner)
    assert len(snaps) == 2
    for snap in snaps:
        assert_precise(snap['mean'], snap['var'], inputs, snap['weight'])
    ckpt = torch.load(osp.join(tmp_path, 'epoch_2.pth'))['state_dict']
    assert_precise(ckpt['backbone.stem.bn.running_mean'],
                   ckpt['backbone.stem.bn.running_var'], inputs,
                   ckpt['backbone.stem.conv.weight'])
    scalars = [json.loads(line) for line in open(
        osp.join(runner.log_dir, 'vis_data', 'scalars.json'))]
    assert any('precise_bn/var_change' in s for s in scalars)


def test_without_the_hook_stats_are_not_precise(tmp_path, clean_mmengine):
    """The check above can fail: EMA statistics are far from exact."""
    cfg = precise_cfg(EPOCH_CONFIG, tmp_path, train_cfg=dict(max_epochs=2))
    cfg.custom_hooks = [dict(type='ValSnapshotHook')]
    runner = Runner.from_cfg(cfg)
    runner.train()
    snap = val_snapshots(runner)[-1]
    with pytest.raises(AssertionError):
        assert_precise(snap['mean'], snap['var'], train_inputs(cfg),
                       snap['weight'])


def test_iter_runner_validates_with_precise_stats(tmp_path, clean_mmengine):
    cfg = precise_cfg(
        ITER_CONFIG, tmp_path, hook=dict(interval=5),
        train_cfg=dict(max_iters=12, val_interval=6),
        param_scheduler=[dict(type='ConstantLR', factor=1.0,
                              by_epoch=False)],
        default_hooks=dict(checkpoint=dict(interval=6)))
    runner = Runner.from_cfg(cfg)
    runner.train()
    # runs at iterations 5, 10 and (at_end) 12; validation at 6 and 12
    snaps = val_snapshots(runner)
    assert len(snaps) == 2
    inputs = train_inputs(cfg)
    # at iteration 6 the stats are from iteration 5's weights: not exact
    with pytest.raises(AssertionError):
        assert_precise(snaps[0]['mean'], snaps[0]['var'], inputs,
                       snaps[0]['weight'])
    assert_precise(snaps[1]['mean'], snaps[1]['var'], inputs,
                   snaps[1]['weight'])


@pytest.mark.parametrize('update_buffers', [False, True])
def test_ema_model_gets_stats_for_the_ema_weights(tmp_path, clean_mmengine,
                                                  update_buffers):
    cfg = precise_cfg(EPOCH_CONFIG, tmp_path, train_cfg=dict(max_epochs=2))
    cfg.custom_hooks.append(
        dict(type='EMAHook', momentum=0.2, update_buffers=update_buffers))
    runner = Runner.from_cfg(cfg)
    runner.train()
    inputs = train_inputs(cfg)
    ema = [h for h in runner.hooks if type(h).__name__ == 'EMAHook'][0]
    raw_weight = runner.model.backbone.stem.conv.weight.detach()
    for snap in val_snapshots(runner):  # validation sees the EMA weights
        assert not torch.equal(snap['weight'], raw_weight)
        assert_precise(snap['mean'], snap['var'], inputs, snap['weight'])
    # the checkpoint's state_dict holds the EMA weights and their stats
    ckpt = torch.load(osp.join(tmp_path, 'epoch_2.pth'))
    state = ckpt['state_dict']
    assert_precise(state['backbone.stem.bn.running_mean'],
                   state['backbone.stem.bn.running_var'], inputs,
                   state['backbone.stem.conv.weight'])
    # and the raw model keeps stats for the raw weights
    bn = runner.model.backbone.stem.bn
    assert_precise(bn.running_mean, bn.running_var, inputs, raw_weight)


def test_ema_switch_off_leaves_the_ema_stats_alone(tmp_path, clean_mmengine):
    cfg = precise_cfg(EPOCH_CONFIG, tmp_path, hook=dict(update_ema=False),
                      train_cfg=dict(max_epochs=2))
    cfg.custom_hooks.append(dict(type='EMAHook', momentum=0.2))
    runner = Runner.from_cfg(cfg)
    runner.train()
    snap = val_snapshots(runner)[-1]
    with pytest.raises(AssertionError):
        assert_precise(snap['mean'], snap['var'], train_inputs(cfg),
                       snap['weight'])


# ---------------------------------------------- the training stream stays
def recorded_run(tmp_path, config, with_hook, num_workers, persistent):
    overrides = dict(train_cfg=dict(max_epochs=2)) if config == EPOCH_CONFIG \
        else dict(train_cfg=dict(max_iters=20, val_interval=10),
                  param_scheduler=[dict(type='ConstantLR', factor=1.0,
                                        by_epoch=False)])
    cfg = small_cfg(config, tmp_path, **overrides)
    cfg.train_dataloader.num_workers = num_workers
    cfg.train_dataloader.persistent_workers = persistent
    cfg.custom_imports = dict(imports=['tests.helpers.record_batches_hook'])
    cfg.custom_hooks = [dict(type='RecordBatchesHook')]
    if with_hook:
        cfg.custom_hooks.append(
            dict(type='PreciseBNHook', num_samples=48, interval=1 if config
                 == EPOCH_CONFIG else 3, progress=False))
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=100)
    Runner.from_cfg(cfg).train()
    return read_batches(tmp_path)


@pytest.mark.parametrize('config', [EPOCH_CONFIG, ITER_CONFIG],
                         ids=['epoch', 'iter'])
@pytest.mark.parametrize('num_workers, persistent', [(0, False), (2, False),
                                                     (2, True)])
def test_training_stream_is_untouched(tmp_path, clean_mmengine, config,
                                      num_workers, persistent):
    plain = recorded_run(tmp_path / 'plain', config, False, num_workers,
                         persistent)
    hooked = recorded_run(tmp_path / 'hooked', config, True, num_workers,
                          persistent)
    assert [r['idx'] for r in hooked] == [r['idx'] for r in plain]
    # same augmentation draws too (RandomShift uses the global RNG)
    np.testing.assert_allclose([r['checksum'] for r in hooked],
                               [r['checksum'] for r in plain], rtol=0)


# ------------------------------------------------------------ distributed
def _train_two_ranks(rank, world_size, work_dir):
    from mmstats.utils import setup_launcher
    cfg = precise_cfg(EPOCH_CONFIG, work_dir, train_cfg=dict(max_epochs=1))
    cfg.launcher = 'pytorch'
    setup_launcher(cfg)
    runner = Runner.from_cfg(cfg)
    runner.train()
    model = runner.model.module
    # numpy, not tensors: torch's queue shares tensors through the sender
    return dict(buffers={k: v.numpy().copy() for k, v in
                         model.state_dict().items() if 'running' in k},
                weight=model.backbone.stem.conv.weight.detach().numpy().copy())


def test_two_ranks_end_with_identical_precise_stats(tmp_path):
    results = run_distributed(_train_two_ranks, 2, str(tmp_path),
                              timeout=240)
    for key, value in results[0]['buffers'].items():
        np.testing.assert_array_equal(value, results[1]['buffers'][key],
                                      err_msg=key)
    cfg = precise_cfg(EPOCH_CONFIG, tmp_path)
    buffers = {k: torch.from_numpy(v) for k, v in results[0]['buffers'].items()}
    assert_precise(buffers['backbone.stem.bn.running_mean'],
                   buffers['backbone.stem.bn.running_var'], train_inputs(cfg),
                   torch.from_numpy(results[0]['weight']))
