"""ModuleStatsHook and modules whose forward hooks never fire.

mmseg's decode heads call ``self.forward(inputs)`` in ``loss()``, so forward
hooks on ``decode_head`` never see its output; a ``ModuleList`` iterated by
its parent is never called at all. Such a module has norms but no ``act``:
the hook says so once per module, naming it, and stays silent for modules
that are called. The toy has mmseg's ``EncoderDecoder`` shape (a backbone
of blocks in a ``ModuleList``, a decode head whose ``loss`` calls its own
``forward``, a ``conv_seg`` inside it) and trains in a real Runner.
"""
import glob
import os.path as osp
import time

import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from mmengine.runner import Runner
from torch import nn

from tests.helpers.runner import read_scalars, toy_cfg

UNSEEN = 'ModuleStatsHook: no floating-point output of '


class DecodeHead(nn.Module):
    """mmseg's ``BaseDecodeHead`` shape: ``loss`` calls ``self.forward``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bottleneck = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv_seg = nn.Conv2d(channels, 10, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_seg(F.relu(self.bottleneck(x)))

    def loss(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        logits = self.forward(x).mean(dim=(2, 3))  # as mmseg does
        return dict(loss_ce=F.cross_entropy(logits, labels))


@MODELS.register_module(force=True)
class ToyEncoderDecoder(BaseModel):
    """A ``ModuleList`` of blocks (iterated, never called) and a decode
    head trained through its ``loss``."""

    def __init__(self, channels: int = 8, data_preprocessor=None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.backbone = nn.Module()
        self.backbone.blocks = nn.ModuleList([
            nn.Sequential(
                nn.Conv2d(1 if i == 0 else channels, channels, 3, padding=1),
                nn.ReLU()) for i in range(2)
        ])
        self.decode_head = DecodeHead(channels)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        x = inputs
        for block in self.backbone.blocks:
            x = block(x)
        if mode == 'loss':
            return self.decode_head.loss(x, data_samples['gt_label'])
        logits = self.decode_head(x).mean(dim=(2, 3))
        if mode == 'tensor':
            return logits
        return [
            dict(pred=p, gt=g)
            for p, g in zip(logits.argmax(1), data_samples['gt_label'])
        ]


def _train(tmp_path, max_iters: int = 6, **module_stats):
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=max_iters,
        log_interval=2,
        experiment_name=f'unseen_{time.time_ns()}',
        custom_hooks=[
            dict(type='mmstats.StatsCollectorHook'),
            dict(type='mmstats.ModuleStatsHook', **module_stats),
        ])
    cfg.model = dict(type='ToyEncoderDecoder')
    runner = Runner.from_cfg(cfg)
    runner.train()
    logs = glob.glob(osp.join(runner.log_dir, '*.log'))
    with open(logs[0]) as f:
        return read_scalars(runner), f.read()


def test_unseen_modules_warned_once_and_their_norms_published(
        tmp_path, clean_mmengine):
    scalars, log = _train(
        tmp_path, modules=r'backbone\.blocks(\.\d)?|decode_head(\.conv_seg)?')
    assert log.count(UNSEEN) == 1, log
    line = log.split(UNSEEN, 1)[1].split('\n', 1)[0]
    assert line.startswith('backbone.blocks, decode_head was seen on '
                           'training iteration 2, a publication'), line
    assert 'module.forward(...)' in line and 'ModuleList' in line
    assert sorted(s for s, r in scalars.items()
                  if 'stats/loss/mean' in r) == [2, 4, 6]
    for step in (2, 4, 6):
        record = scalars[step]
        for name in ('backbone.blocks.0', 'backbone.blocks.1',
                     'decode_head.conv_seg'):
            key = f'stats/modules/{name}'
            assert record[f'{key}/act/std'] > 0, (step, name)
        for name in ('backbone.blocks', 'decode_head'):
            key = f'stats/modules/{name}'
            assert f'{key}/act/mean' not in record, (step, name)
            assert record[f'{key}/weight_norm/mean'] > 0, (step, name)
            assert record[f'{key}/grad_norm/mean'] > 0, (step, name)


def test_modules_that_are_called_give_no_warning(tmp_path, clean_mmengine):
    scalars, log = _train(
        tmp_path, modules=r'backbone\.blocks\.\d|decode_head\.conv_seg')
    assert UNSEEN not in log
    assert scalars[6]['stats/modules/decode_head.conv_seg/act/std'] > 0


def test_without_act_nothing_is_said(tmp_path, clean_mmengine):
    """stats without 'act': a module never called is no news."""
    scalars, log = _train(
        tmp_path,
        max_iters=2,
        modules='decode_head',
        stats=('grad_norm', 'weight_norm'))
    assert UNSEEN not in log
    assert scalars[2]['stats/modules/decode_head/grad_norm/mean'] > 0
