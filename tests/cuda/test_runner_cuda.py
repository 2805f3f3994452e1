"""PreciseBNHook + StatsCollectorHook + ModuleStatsHook in a real mmengine
Runner on CUDA with AMP (AmpOptimWrapper)."""
import json
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner

from tests.helpers.runner import toy_cfg
from .common import requires_cuda

pytestmark = requires_cuda


@HOOKS.register_module(force=True)
class CudaLossRecorderHook(Hook):
    """Keeps every iteration's loss (a test may sync) and the device."""

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self.losses = []
        self.devices = set()

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self.losses.append(float(outputs['loss']))
        self.devices.add(outputs['loss'].device.type)


def _scalars(runner) -> dict:
    merged = {}
    with open(osp.join(runner.log_dir, 'vis_data', 'scalars.json')) as f:
        for line in f:
            record = json.loads(line)
            merged.setdefault(record['step'], {}).update(record)
    return merged


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_amp_runner_with_all_hooks(tmp_path, clean_mmengine, dtype):
    cfg = toy_cfg(
        tmp_path,
        num_samples=160,
        batch_size=16,
        max_epochs=2,
        log_interval=4,
        report_stats=True)
    cfg.optim_wrapper = dict(
        type='AmpOptimWrapper',
        dtype=dtype,
        optimizer=dict(type='SGD', lr=0.1, momentum=0.9))
    hooks = [
        dict(type='mmstats.PreciseBNHook', num_samples=160, progress=False),
        dict(
            type='mmstats.StatsCollectorHook',
            stats=('mean', 'std', 'num', 'max')),
        dict(type='CudaLossRecorderHook'),
        dict(type='mmstats.ModuleStatsHook', modules=r'backbone\.stem'),
    ]
    cfg.custom_hooks = hooks
    runner = Runner.from_cfg(cfg)
    runner.train()
    model = runner.model
    assert next(model.parameters()).device.type == 'cuda'
    recorder = [
        h for h in runner.hooks if isinstance(h, CudaLossRecorderHook)
    ][0]
    assert recorder.devices == {'cuda'}
    losses = np.array(recorder.losses)
    assert len(losses) == 20
    scalars = _scalars(runner)
    steps = sorted(s for s, r in scalars.items() if 'stats/loss/mean' in r)
    assert steps == [4, 8, 10, 14, 18, 20]
    start = 0
    for step in steps:
        window = losses[start:step]
        record = scalars[step]
        assert record['stats/loss/num'] == len(window)
        np.testing.assert_allclose(
            record['stats/loss/mean'], window.mean(), rtol=1e-6)
        np.testing.assert_allclose(
            record['stats/loss/std'], window.std(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(
            record['stats/loss/max'], window.max(), rtol=1e-6)
        # one feature norm per sample of the interval
        assert record['stats/model/feat_norm/num'] == 16 * len(window)
        start = step
    _check_module_stats(scalars, steps)
    _check_stem_statistics(runner, dtype)


def _check_module_stats(scalars: dict, steps: list) -> None:
    """Every publication covers one instrumented iteration: the stem's
    whole output (16 x 8 channels x 8 x 8) and one unscaled gradient
    norm (AMP's loss scale, 65536 at the start, divided out)."""
    key = 'stats/modules/backbone.stem/{}/{}'.format
    for step in steps:
        record = scalars[step]
        assert record[key('act', 'num')] == 16 * 8 * 8 * 8, step
        assert record[key('grad_norm', 'num')] == 1, step
        assert record[key('weight_norm', 'num')] == 1, step
        assert 0 < record[key('grad_norm', 'mean')] < 1e3, step
        assert 0 <= record[key('update_ratio', 'mean')] < 1, step


def _check_stem_statistics(runner, dtype):
    """After training, the stem BN holds the population statistics of its
    AMP inputs over the whole training set (num_samples == dataset size);
    the stem BN's input does not depend on how batches were formed."""
    model = runner.model
    dataset = runner.train_dataloader.dataset
    images = torch.stack([dataset[i]['inputs'] for i in range(len(dataset))])
    with torch.no_grad(), torch.autocast('cuda', dtype=getattr(torch, dtype)):
        x = model.backbone.stem.conv(images.cuda()).double()
    mean = x.mean(dim=(0, 2, 3))
    var = x.var(dim=(0, 2, 3), unbiased=False)
    bn = model.backbone.stem.bn
    # the convolution's algorithm may depend on the batch size: the
    # rounding of half-precision outputs differs by a few ulps
    tol = 2e-3 if dtype == 'float16' else 2e-2
    np.testing.assert_allclose(
        bn.running_mean.double().cpu(), mean.cpu(), rtol=tol, atol=tol)
    np.testing.assert_allclose(
        bn.running_var.double().cpu(), var.cpu(), rtol=tol, atol=tol)
