"""PreciseBNHook: interval logic (mocked Runner) and real Runners."""
import json
import os.path as osp
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.dataset import DefaultSampler
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner

from mmstats.hooks import PreciseBNHook
from mmstats.registry import HOOKS
from tests.helpers.dist import run_distributed
from tests.helpers.record_batches_hook import read_batches
from tests.helpers.runner import gloo_launch, toy_cfg
from tests.helpers.toy import ToyBNModel

SUMMARY = dict(
    num_layers=6,
    num_samples=64,
    num_batches=4,
    seconds=0.1,
    var_change=0.05,
    mean_change=0.01,
    skipped=[],
    frozen=[],
    unaffected_norms=[])


# --------------------------------------------------------------- build time
# a wrong type is a TypeError, a wrong value a ValueError (mmstats.utils.args;
# before issue 29 num_samples, interval and estimator of a wrong type were
# ValueErrors)
@pytest.mark.parametrize(
    'kwargs, error, match',
    [
        (dict(num_samples=0), ValueError,
         'num_samples must be a positive int'),
        (dict(num_samples=10.5), TypeError,
         'num_samples must be a positive int'),
        (dict(interval=0), ValueError, 'interval must be a positive int'),
        (dict(by_epoch='yes'), TypeError, 'by_epoch must be None'),
        # 0 == False and 1.0 == True: types are checked, not equality
        (dict(by_epoch=0), TypeError,
         r'by_epoch must be None .*got 0 of type int'),
        (dict(by_epoch=1), TypeError,
         r'by_epoch must be None .*got 1 of type int'),
        (dict(by_epoch=1.0), TypeError,
         r'by_epoch must be None .*got 1.0 of type float'),
        (dict(by_epoch=np.bool_(True)), TypeError, 'by_epoch must be None'),
        (dict(estimator='ema'), ValueError, 'estimator must be one of'),
        (dict(estimator=['population']), TypeError,
         'estimator must be one of'),
        (dict(dataloader='train'), TypeError, 'dataloader must be None or a'),
        (dict(at_end=1), TypeError,
         'at_end must be True or False, got 1 .*write at_end='),
        (dict(at_end=None), TypeError, 'at_end must be True or False'),
        (dict(update_ema=0), TypeError,
         'update_ema must be True or False, got 0 '),
        (dict(progress=1.0), TypeError,
         'progress must be True or False, got 1.0 '),
        (dict(interval=True), TypeError, 'interval must be a positive int'),
        (dict(num_samples=True), TypeError,
         'num_samples must be a positive int'),
    ])
def test_invalid_arguments_fail_when_the_hook_is_built(kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        HOOKS.build(dict(type='PreciseBNHook', **kwargs))
    assert type(info.value) is error


def test_registered_with_priority_above_normal():
    hook = HOOKS.build(dict(type='mmstats.PreciseBNHook'))
    assert isinstance(hook, PreciseBNHook)
    assert hook.priority == 'ABOVE_NORMAL'
    assert HOOKS.get('PreciseBNHook') is PreciseBNHook


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
        hook.before_run(runner)
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
    (dict(interval=2, at_end=False), EpochBasedTrainLoop, [(1, 19), (3, 39)]),
    (dict(interval=20), IterBasedTrainLoop, [(1, 19), (3, 39), (4, 49)]),
    (dict(interval=25, at_end=False), IterBasedTrainLoop, [(2, 24), (4, 49)]),
    (dict(interval=3, by_epoch=True), IterBasedTrainLoop, [(2, 29), (4, 49)]),
    (dict(interval=20, by_epoch=False), EpochBasedTrainLoop, [(1, 19), (3, 39),
                                                              (4, 49)]),
])
def test_interval_logic(kwargs, loop, expected):
    hook = PreciseBNHook(**kwargs)
    runner = mock_runner(loop)
    assert fire(hook, runner) == expected


def test_no_batchnorm_is_decided_per_run():
    """One instance: a model without BN (nothing), then one with BN."""
    hook = PreciseBNHook()
    runner = mock_runner(EpochBasedTrainLoop)
    runner.model = torch.nn.Sequential(torch.nn.GroupNorm(1, 3))
    assert fire(hook, runner) == []
    assert hook.interval == 1
    runner.model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    assert len(fire(hook, runner)) == 5


def test_run_counter_goes_into_the_checkpoint():
    hook = PreciseBNHook()
    runner = mock_runner(EpochBasedTrainLoop)
    fire(hook, runner)
    checkpoint = dict(meta=dict(epoch=5))
    hook.before_save_checkpoint(runner, checkpoint)
    assert checkpoint['meta'] == dict(epoch=5, precise_bn_runs=5)
    resumed = PreciseBNHook()
    resumed.after_load_checkpoint(runner, checkpoint)
    assert resumed._num_runs == 5
    resumed.after_load_checkpoint(runner, dict(meta={}))  # old checkpoint
    assert resumed._num_runs == 0


def _train_loader(drop_last, num_workers=0):
    from torch.utils.data import DataLoader
    return DataLoader(
        list(range(10)),
        batch_size=4,
        drop_last=drop_last,
        num_workers=num_workers)


@pytest.mark.parametrize('drop_last', [False, True])
@pytest.mark.parametrize('num_workers', [0, 2])
def test_own_loader_follows_the_training_loader(drop_last, num_workers):
    runner = mock_runner(EpochBasedTrainLoop)
    runner.seed = 0
    runner.train_dataloader = _train_loader(drop_last, num_workers)
    hook = PreciseBNHook()
    hook.before_run(runner)
    hook.before_train(runner)
    loader = hook._loader
    assert loader is not runner.train_dataloader
    assert loader.drop_last is drop_last and loader.batch_size == 4
    assert loader.num_workers == num_workers
    assert loader.persistent_workers is (num_workers > 0)
    assert len(loader) == (2 if drop_last else 3)


def test_a_last_batch_of_one_sample_does_not_crash_the_run():
    """9 samples in batches of 4: the last batch (1 sample) would make
    BatchNorm1d raise; the run skips it and uses the 8 others."""
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    runner = mock_runner(EpochBasedTrainLoop)
    runner.model = torch.nn.Sequential(
        torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    runner.seed = 0
    runner.train_dataloader = DataLoader(
        TensorDataset(torch.randn(9, 3) * 2 + 1), batch_size=4)
    hook = PreciseBNHook(num_samples=9, progress=False)
    hook.before_run(runner)
    hook.before_train(runner)
    hook._loader.sampler.set_epoch(0)  # the order the run will see
    used = torch.cat([b[0] for b in hook._loader if len(b[0]) > 1])
    hook._run(runner)
    assert len(used) == 8
    with torch.no_grad():
        h = runner.model[0](used).double()
    bn = runner.model[1]
    torch.testing.assert_close(
        bn.running_mean.double(), h.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        bn.running_var.double(),
        h.var(0, unbiased=False),
        rtol=1e-5,
        atol=1e-6)


def test_incomplete_dataloader_config_fails_before_training():
    with pytest.raises(
            ValueError,
            match=r"dataloader lacks \['dataset', "
            r"'sampler'\].*dataloader=None"):
        PreciseBNHook(dataloader=dict(batch_size=4))
    # a complete config that cannot be built fails in before_train
    hook = PreciseBNHook(
        dataloader=dict(
            batch_size=4,
            dataset=dict(type='NoSuchDataset'),
            sampler=dict(type='DefaultSampler', shuffle=True)))
    runner = mock_runner(EpochBasedTrainLoop)
    runner.seed = 0
    with pytest.raises(
            ValueError, match='could not build its dataloader.*'
            'NoSuchDataset'):
        hook.before_run(runner)
        hook.before_train(runner)


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
            dict(
                weight=stem.conv.weight.detach().clone(),
                mean=stem.bn.running_mean.clone(),
                var=stem.bn.running_var.clone()))


@ROOT_HOOKS.register_module(force=True)
class BNVarSnapshotHook(Hook):
    """Every BN layer's running_var at the end of each epoch, before
    (priority HIGH) or after (NORMAL) PreciseBNHook (ABOVE_NORMAL); the
    config's ``priority`` is taken by ``Runner.register_hook``."""

    def __init__(self):
        self.snapshots = []

    def after_train_epoch(self, runner):
        self.snapshots.append([
            m.running_var.double().numpy().copy()
            for m in runner.model.modules()
            if isinstance(m, torch.nn.BatchNorm2d)
        ])


def train_inputs(cfg) -> torch.Tensor:
    from mmengine.registry import DATASETS
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    return torch.stack([dataset[i]['inputs'] for i in range(len(dataset))])


def stem_reference(inputs, weight):
    """float64 mean/var over all values that the stem BN sees.

    The stem BN follows a bias-free conv: its inputs do not depend on how
    the data is batched, so this is the exact population statistic."""
    out = F.conv2d(inputs.double(), weight.double(), padding=1)
    return (out.mean(dim=(0, 2, 3)), out.var(dim=(0, 2, 3), unbiased=False))


def assert_precise(mean, var, inputs, weight, rtol=1e-4):
    ref_mean, ref_var = stem_reference(inputs, weight)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=rtol, atol=1e-5)
    torch.testing.assert_close(var.double(), ref_var, rtol=rtol, atol=1e-6)


def precise_cfg(tmp_path, hook=None, **kwargs):
    cfg = toy_cfg(tmp_path, **kwargs)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook',
        interval=1,
        by_epoch=kwargs.get('by_epoch', True))
    cfg.custom_hooks = [
        dict(
            type='mmstats.PreciseBNHook',
            num_samples=10_000,
            progress=False,
            **(hook or {})),
        dict(type='ValSnapshotHook')
    ]
    return cfg


def hooks_of(runner, cls):
    return [h for h in runner.hooks if isinstance(h, cls)]


def read_scalars(runner):
    with open(osp.join(runner.log_dir, 'vis_data', 'scalars.json')) as f:
        return [json.loads(line) for line in f]


def test_epoch_runner_validates_with_precise_stats(tmp_path, clean_mmengine):
    cfg = precise_cfg(tmp_path)
    runner = Runner.from_cfg(cfg)
    runner.train()
    inputs = train_inputs(cfg)
    snaps = hooks_of(runner, ValSnapshotHook)[0].snapshots
    assert len(snaps) == 2
    for snap in snaps:
        assert_precise(snap['mean'], snap['var'], inputs, snap['weight'])
    ckpt = torch.load(osp.join(tmp_path, 'epoch_2.pth'), weights_only=False)
    assert ckpt['meta']['precise_bn_runs'] == 2
    state = ckpt['state_dict']
    assert_precise(state['backbone.stem.bn.running_mean'],
                   state['backbone.stem.bn.running_var'], inputs,
                   state['backbone.stem.conv.weight'])


def test_without_the_hook_stats_are_not_precise(tmp_path, clean_mmengine):
    """The check above can fail: EMA statistics are far from exact."""
    cfg = precise_cfg(tmp_path)
    cfg.custom_hooks = [dict(type='ValSnapshotHook')]
    runner = Runner.from_cfg(cfg)
    runner.train()
    snap = hooks_of(runner, ValSnapshotHook)[0].snapshots[-1]
    with pytest.raises(AssertionError):
        assert_precise(snap['mean'], snap['var'], train_inputs(cfg),
                       snap['weight'])


def test_iter_runner_validates_with_precise_stats(tmp_path, clean_mmengine):
    cfg = precise_cfg(
        tmp_path,
        hook=dict(interval=5),
        by_epoch=False,
        max_iters=12,
        val_interval=6)
    runner = Runner.from_cfg(cfg)
    runner.train()
    # runs at iterations 5, 10 and (at_end) 12; validation at 6 and 12
    snaps = hooks_of(runner, ValSnapshotHook)[0].snapshots
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
    cfg = precise_cfg(tmp_path)
    cfg.custom_hooks.append(
        dict(type='EMAHook', momentum=0.2, update_buffers=update_buffers))
    runner = Runner.from_cfg(cfg)
    runner.train()
    inputs = train_inputs(cfg)
    raw_weight = runner.model.backbone.stem.conv.weight.detach()
    for snap in hooks_of(runner, ValSnapshotHook)[0].snapshots:
        assert not torch.equal(snap['weight'], raw_weight)  # EMA weights
        assert_precise(snap['mean'], snap['var'], inputs, snap['weight'])
    # the checkpoint's state_dict holds the EMA weights and their stats
    state = torch.load(
        osp.join(tmp_path, 'epoch_2.pth'), weights_only=False)['state_dict']
    assert_precise(state['backbone.stem.bn.running_mean'],
                   state['backbone.stem.bn.running_var'], inputs,
                   state['backbone.stem.conv.weight'])
    # and the raw model keeps stats for the raw weights
    bn = runner.model.backbone.stem.bn
    assert_precise(bn.running_mean, bn.running_var, inputs, raw_weight)


def test_ema_switch_off_leaves_the_ema_stats_alone(tmp_path, clean_mmengine):
    cfg = precise_cfg(tmp_path, hook=dict(update_ema=False))
    cfg.custom_hooks.append(dict(type='EMAHook', momentum=0.2))
    runner = Runner.from_cfg(cfg)
    runner.train()
    snap = hooks_of(runner, ValSnapshotHook)[0].snapshots[-1]
    with pytest.raises(AssertionError):
        assert_precise(snap['mean'], snap['var'], train_inputs(cfg),
                       snap['weight'])


def test_recomputation_forwards_never_reach_the_statistics(
        tmp_path, clean_mmengine):
    """The model reports in every forward; precise BN (model and EMA
    model) forwards must not be counted with the training samples."""
    cfg = precise_cfg(
        tmp_path, num_samples=150, report_stats=True, max_epochs=2)
    cfg.custom_hooks[0]['num_samples'] = 64
    cfg.custom_hooks += [
        dict(type='mmstats.StatsCollectorHook', stats=('num', 'mean')),
        dict(type='EMAHook', momentum=0.2)
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    nums = [
        r['stats/model/feat_norm/num'] for r in read_scalars(runner)
        if 'stats/model/feat_norm/num' in r
    ]
    assert sum(nums) == 2 * 150  # training samples only, every one once


def test_var_change_is_logged_once_per_run(tmp_path, clean_mmengine):
    """3 epochs of 10 iterations, a line every 4: each run's var_change is
    on the first line after it (epochs 2, 3) or, after the last run, in
    scalars.json only; never repeated. Values against float64 numpy."""
    cfg = precise_cfg(tmp_path, max_epochs=3, log_interval=4)
    cfg.custom_hooks += [
        dict(type='BNVarSnapshotHook', priority='HIGH'),
        dict(type='BNVarSnapshotHook', priority='NORMAL')
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    before, after = [h.snapshots for h in hooks_of(runner, BNVarSnapshotHook)]
    expected = [
        np.mean(
            [np.abs(n - o).sum() / np.abs(o).sum() for o, n in zip(old, new)])
        for old, new in zip(before, after)
    ]
    records = [r for r in read_scalars(runner) if 'precise_bn/var_change' in r]
    assert [r['step'] for r in records] == [14, 24, 30]
    np.testing.assert_allclose([r['precise_bn/var_change'] for r in records],
                               expected,
                               rtol=1e-5)
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    lines = [ln for ln in log.splitlines() if 'precise_bn/var_change' in ln]
    assert len(lines) == 2
    assert 'Epoch(train) [2][ 4/10]' in lines[0]
    assert 'Epoch(train) [3][ 4/10]' in lines[1]
    assert 'ProgressBar' not in log and '\r' not in log


@pytest.fixture
def mmengine_checkpoints():
    """Resuming under torch.load(weights_only=True): allowlist mmengine's
    classes for this test only."""
    from mmstats.launch import allow_mmengine_checkpoints
    if not hasattr(torch.serialization, 'get_safe_globals'):  # torch < 2.5
        allow_mmengine_checkpoints()  # nothing to allow: weights_only=False
        yield
        return
    saved = torch.serialization.get_safe_globals()
    allow_mmengine_checkpoints()
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(saved)


def test_resume_continues_the_sampling_sequence(tmp_path, clean_mmengine,
                                                mmengine_checkpoints):
    cfg = precise_cfg(tmp_path, max_epochs=2)
    Runner.from_cfg(cfg).train()
    cfg = precise_cfg(tmp_path, max_epochs=3)
    cfg.resume = True
    runner = Runner.from_cfg(cfg)
    seen = []
    hook = hooks_of(runner, PreciseBNHook)[0]
    real = hook._recompute

    def spy(*args):
        out = real(*args)
        sampler = hook._loader.sampler  # what this run sampled
        seen.append((sampler.epoch, list(sampler)))
        return out

    hook._recompute = spy
    runner.train()
    # one run after the resume, the third: its sampler is at epoch 2 and
    # draws epoch 2's order, not the first run's again
    assert [epoch for epoch, _ in seen] == [2]
    dataset = hook._loader.dataset
    orders = []
    for epoch in range(3):
        sampler = DefaultSampler(dataset, shuffle=True, seed=runner.seed)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert seen[0][1] == orders[2]
    assert orders[2] != orders[0] and orders[2] != orders[1]
    ckpt = torch.load(osp.join(tmp_path, 'epoch_3.pth'), weights_only=False)
    assert ckpt['meta']['precise_bn_runs'] == 3


# ---------------------------------------------- the training stream stays
def recorded_run(tmp_path, by_epoch, with_hook, num_workers):
    cfg = toy_cfg(
        tmp_path,
        by_epoch=by_epoch,
        max_epochs=2,
        max_iters=20,
        val_interval=10 if not by_epoch else None)
    cfg.train_dataloader.num_workers = num_workers
    cfg.train_dataloader.persistent_workers = num_workers > 0
    cfg.custom_imports = dict(imports=['tests.helpers.record_batches_hook'])
    cfg.custom_hooks = [dict(type='RecordBatchesHook')]
    if with_hook:
        cfg.custom_hooks.append(
            dict(
                type='mmstats.PreciseBNHook',
                num_samples=48,
                interval=1 if by_epoch else 3,
                progress=False))
    Runner.from_cfg(cfg).train()
    return read_batches(tmp_path)


@pytest.mark.parametrize('by_epoch', [True, False], ids=['epoch', 'iter'])
@pytest.mark.parametrize('num_workers', [0, 2])
def test_training_stream_is_untouched(tmp_path, clean_mmengine, by_epoch,
                                      num_workers):
    plain = recorded_run(tmp_path / 'plain', by_epoch, False, num_workers)
    hooked = recorded_run(tmp_path / 'hooked', by_epoch, True, num_workers)
    assert [r['idx'] for r in hooked] == [r['idx'] for r in plain]
    np.testing.assert_allclose([r['checksum'] for r in hooked],
                               [r['checksum'] for r in plain],
                               rtol=0)


# ------------------------------------------------------------ distributed
def _train_two_ranks(rank, world_size, work_dir):
    cfg = gloo_launch(precise_cfg(work_dir, max_epochs=1))
    runner = Runner.from_cfg(cfg)
    runner.train()
    model = runner.model.module
    # numpy, not tensors: torch's queue shares tensors through the sender
    return dict(
        buffers={
            k: v.numpy().copy()
            for k, v in model.state_dict().items() if 'running' in k
        },
        weight=model.backbone.stem.conv.weight.detach().numpy().copy())


def test_two_ranks_end_with_identical_precise_stats(tmp_path):
    results = run_distributed(_train_two_ranks, 2, str(tmp_path), timeout=240)
    for key, value in results[0]['buffers'].items():
        np.testing.assert_array_equal(
            value, results[1]['buffers'][key], err_msg=key)
    cfg = precise_cfg(tmp_path)
    buffers = {
        k: torch.from_numpy(v)
        for k, v in results[0]['buffers'].items()
    }
    assert_precise(buffers['backbone.stem.bn.running_mean'],
                   buffers['backbone.stem.bn.running_var'], train_inputs(cfg),
                   torch.from_numpy(results[0]['weight']))


@pytest.mark.parametrize('old_checkpoint', [False, True])
def test_resume_is_silent_and_var_change_still_logged_once(
        tmp_path, clean_mmengine, mmengine_checkpoints, old_checkpoint):
    """Resuming a run that used the hook: no 'resumed key ... is not
    defined in message_hub' warning (also from a checkpoint written by an
    older version, whose hub state lists the keys as resumable), and the
    resumed run's var_change is on its first log line after the run and in
    scalars.json, once, with the value update_bn_stats returned."""
    cfg = precise_cfg(tmp_path, max_epochs=2, log_interval=4)
    Runner.from_cfg(cfg).train()
    path = osp.join(tmp_path, 'epoch_2.pth')
    ckpt = torch.load(path, weights_only=False)
    hub = ckpt['message_hub']
    assert not any('precise_bn' in k for k in hub['resumed_keys'])
    assert not any('precise_bn' in k for k in hub['log_scalars'])
    if old_checkpoint:  # what the previous version wrote
        for key in ('train/precise_bn/var_change',
                    'train/precise_bn/ema_var_change'):
            hub['resumed_keys'][key] = True
        torch.save(ckpt, path)
    # its own work_dir: two Runners built in the same second would share
    # a log dir (and scalars.json)
    cfg = precise_cfg(tmp_path / 'resumed', max_epochs=4, log_interval=4)
    cfg.resume, cfg.load_from = True, path
    runner = Runner.from_cfg(cfg)
    hook = hooks_of(runner, PreciseBNHook)[0]
    summaries = []
    real = hook._recompute
    hook._recompute = lambda *a: summaries.append(real(*a)) or summaries[-1]
    runner.train()
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert 'resumed epoch: 2' in log
    assert 'is not defined in message_hub' not in log
    assert len(summaries) == 2  # epochs 3 and 4
    expected = [s['var_change'] for s in summaries]
    records = [r for r in read_scalars(runner) if 'precise_bn/var_change' in r]
    assert [r['step'] for r in records] == [34, 40]  # 40: scalars.json only
    np.testing.assert_allclose([r['precise_bn/var_change'] for r in records],
                               expected)
    lines = [ln for ln in log.splitlines() if 'precise_bn/var_change' in ln]
    assert len(lines) == 1 and 'Epoch(train) [4][ 4/10]' in lines[0]
    assert f'precise_bn/var_change: {expected[0]:.4f}' in lines[0]


# ------------------------------------------------- every BN layer frozen
@ROOT_MODELS.register_module(force=True)
class NormEvalToyModel(ToyBNModel):
    """The toy model with mmpretrain/mmdet's ``norm_eval``: ``train()``
    leaves every BN layer in eval mode while ``norm_eval`` is True."""

    def __init__(self, norm_eval: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.norm_eval = norm_eval

    def train(self, mode: bool = True):
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self


@ROOT_HOOKS.register_module(force=True)
class UnfreezeBNHook(Hook):
    """Sets ``norm_eval=False`` before epoch ``at`` (0-based): the loop's
    ``model.train()`` then puts the BN layers in training mode."""

    def __init__(self, at: int) -> None:
        self.at = at

    def before_train_epoch(self, runner) -> None:
        if runner.epoch == self.at:
            runner.model.norm_eval = False


def bn_buffers(model):
    return {
        k: v.clone()
        for k, v in model.state_dict().items()
        if 'running' in k or 'num_batches' in k
    }


def test_all_bn_frozen_says_so_once_and_publishes_nothing(
        tmp_path, clean_mmengine):
    cfg = precise_cfg(tmp_path, max_epochs=3, log_interval=4)
    cfg.model = dict(type='NormEvalToyModel')
    runner = Runner.from_cfg(cfg)
    before = bn_buffers(runner.model)
    runner.train()
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert log.count('every BatchNorm layer stays in eval mode') == 1
    assert 'nothing to recompute, nothing is published' in log
    assert 'PreciseBN (model)' not in log  # no 'updated 0 BN layers' line
    assert 'precise_bn' not in log
    assert not [r for r in read_scalars(runner) if 'precise_bn/' in str(r)]
    for key, value in bn_buffers(runner.model).items():
        assert torch.equal(value, before[key]), key
    assert hooks_of(runner, PreciseBNHook)[0]._num_runs == 0


def test_bn_unfrozen_mid_run_is_recomputed_from_then_on(
        tmp_path, clean_mmengine):
    """Frozen in epoch 1, unfrozen from epoch 2: one line saying so, runs
    after epochs 2 and 3 only, their var_change published as usual."""
    cfg = precise_cfg(tmp_path, max_epochs=3, log_interval=4)
    cfg.model = dict(type='NormEvalToyModel')
    cfg.custom_hooks.append(dict(type='UnfreezeBNHook', at=1))
    runner = Runner.from_cfg(cfg)
    runner.train()
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert log.count('every BatchNorm layer stays in eval mode') == 1
    assert log.count('2 BatchNorm layers are in training mode now') == 1
    assert log.count('PreciseBN (model): updated 2 BN layers') == 2
    records = [r for r in read_scalars(runner) if 'precise_bn/var_change' in r]
    assert [r['step'] for r in records] == [24, 30]
    assert hooks_of(runner, PreciseBNHook)[0]._num_runs == 2
    snaps = hooks_of(runner, ValSnapshotHook)[0].snapshots
    assert len(snaps) == 3
    assert torch.equal(snaps[0]['mean'], torch.zeros(8))  # frozen: untouched
    assert torch.equal(snaps[0]['var'], torch.ones(8))
    for snap in snaps[1:]:
        assert_precise(snap['mean'], snap['var'], train_inputs(cfg),
                       snap['weight'])


def test_bn_frozen_mid_run_stops_publishing(tmp_path, clean_mmengine):
    """The other way round: trainable in epoch 1, frozen from epoch 2."""

    cfg = precise_cfg(tmp_path, max_epochs=3, log_interval=4)
    cfg.model = dict(type='NormEvalToyModel', norm_eval=False)
    cfg.custom_hooks.append(dict(type='FreezeBNHook', at=1))
    runner = Runner.from_cfg(cfg)
    runner.train()
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert 'stays in eval mode' not in log
    assert log.count('every BatchNorm layer is in eval mode now') == 1
    assert log.count('PreciseBN (model): updated') == 1
    records = [r for r in read_scalars(runner) if 'precise_bn/var_change' in r]
    assert [r['step'] for r in records] == [14]


@ROOT_HOOKS.register_module(force=True)
class FreezeBNHook(UnfreezeBNHook):

    def before_train_epoch(self, runner) -> None:
        if runner.epoch == self.at:
            runner.model.norm_eval = True
