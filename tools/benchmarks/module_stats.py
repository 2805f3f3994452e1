"""Benchmark of ModuleStatsHook on a small conv/BN training run.

Trains a 3 x [Conv2d, BatchNorm2d, ReLU] + Linear classifier (batch 32,
3x32x32 synthetic images, SGD) in real mmengine Runners, with
StatsCollectorHook at the default interval (LoggerHook's 10) and, in the
second setup, ``ModuleStatsHook(modules=..., stats=...)``: by default
the 3 blocks (``features\\.\\d``, like ``backbone\\.layer\\d``), or every
layer with ``--modules 'features\\.\\d\\.\\d'``; ``--stats`` chooses what is
reported. Runs on CUDA when available (the Runner's device).
Setups alternate in every repeat (interleaved, medians). Prints side by
side, from this one run:

1. the overhead on training time: total iteration time with the hook /
   without (median over repeats of the paired ratio), and the same
   estimated from the instrumented iterations' extra time / (interval x
   iteration time) (less noisy: it needs no second run);
2. the cost of the instrumented iteration: its time against a
   non-instrumented one of the same run, and the host time the hook
   reports itself (``modules/instrument_ms``).

Usage: ``python tools/benchmarks/module_stats.py [--iters N] [--repeats R]``
"""
import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.runner import Runner
from mmengine.utils import ManagerMixin
from torch import nn
from torch.utils.data import Dataset

import mmstats  # noqa: F401  (registers the hooks)
from mmstats.hooks.module_stats_hook import MODULE_STATS

INTERVAL = 10  # LoggerHook's default, which StatsCollectorHook follows
DEMO_CONFIG = ('projects/digits_demo/configs/demo/'
               'resnet-mini_1xb64-iter_digits.py')
DEMO_MODULES = r'backbone\.(stem|stages\.\d)|head'  # as in its demo config


class ConvBNNet(BaseModel):

    def __init__(self) -> None:
        super().__init__()
        blocks, cin = [], 3
        for cout, stride in ((16, 1), (32, 2), (32, 2)):
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                    nn.BatchNorm2d(cout), nn.ReLU()))
            cin = cout
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, 10)

    def forward(self, inputs, labels=None, mode='tensor'):
        logits = self.head(self.features(inputs).mean(dim=(2, 3)))
        if mode == 'loss':
            return dict(loss=F.cross_entropy(logits, labels))
        return logits


class Images(Dataset):

    def __init__(self, num: int = 320) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(num, 3, 32, 32, generator=gen)
        self.y = torch.randint(0, 10, (num, ), generator=gen)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, idx: int) -> dict:
        return dict(inputs=self.x[idx], labels=self.y[idx])


def demo_cfg(iters: int, hooks: list, config: str = DEMO_CONFIG):
    """The config of a digits demo run (``projects/digits_demo``; by
    default the iteration-based config, batch 64) of ``iters`` iterations
    with ``hooks``, LoggerHook interval 10, without validation, scheduler
    or checkpoints, in a fresh temporary work dir, quiet."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.param_scheduler = None
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = INTERVAL
    cfg.custom_hooks = hooks
    cfg.work_dir = tempfile.mkdtemp()
    cfg.experiment_name = f'bench_{time.time_ns()}'
    cfg.log_level = 'WARNING'
    return cfg


def demo_runner(iters: int, hooks: list) -> Runner:
    """A Runner of :func:`demo_cfg`."""
    return Runner.from_cfg(demo_cfg(iters, hooks))


def train(iters: int,
          modules: Optional[str],
          batch_size: int,
          stats: Sequence[str] = MODULE_STATS,
          model: str = 'convnet') -> Dict[str, List[float]]:
    """Per-iteration times (s) of one run and the hook's instrument_ms."""
    hooks = [dict(type='mmstats.StatsCollectorHook')]
    if modules:
        hooks.append(
            dict(
                type='mmstats.ModuleStatsHook',
                modules=modules,
                stats=tuple(stats)))
    runner = demo_runner(iters, hooks) if model == 'demo' else Runner(
        model=ConvBNNet(),
        work_dir=tempfile.mkdtemp(),
        experiment_name=f'bench_{time.time_ns()}',
        train_dataloader=dict(
            dataset=Images(),
            batch_size=batch_size,
            num_workers=0,
            sampler=dict(type='InfiniteSampler', shuffle=True),
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=iters),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=INTERVAL),
            checkpoint=None),
        custom_hooks=hooks,
        log_level='WARNING',
        default_scope=None)
    runner.train()
    times = list(runner.message_hub.get_scalar('train/time').data[0])
    cost = published(runner, 'stats/modules/instrument_ms') if modules else []
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    return dict(times=times, instrument_ms=cost)


def published(runner: Runner, name: str) -> List[float]:
    """The values of statistic ``name`` that StatsCollectorHook wrote to
    the run's ``vis_data/scalars.json``, one per publication.

    Statistics are published to the visualizer, not to the MessageHub; a
    one-value statistic under its own name or its name + ``/mean`` (one
    process keeps the spread's name).
    """
    path = os.path.join(runner.log_dir, 'vis_data', 'scalars.json')
    values = []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            for key in (name, f'{name}/mean'):
                if key in record:
                    values.append(record[key])
                    break
    if not values:
        raise KeyError(f'{name} was never published to {path}')
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument(
        '--model',
        choices=['convnet', 'demo'],
        default='convnet',
        help='the conv/BN net below, or the digits demo (ResNet-mini, '
        'batch 64; needs `pip install -e projects/digits_demo`)')
    parser.add_argument(
        '--modules',
        default=None,
        help='ModuleStatsHook(modules=...); defaults to the 3 blocks of '
        'the conv net, or the demo config\'s stem, stages and head')
    parser.add_argument(
        '--stats',
        nargs='+',
        default=list(MODULE_STATS),
        choices=MODULE_STATS,
        help='ModuleStatsHook(stats=)')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.iters, args.repeats = 2 * INTERVAL, 1
    torch.set_num_threads(1)
    if args.modules is None:
        args.modules = DEMO_MODULES if args.model == 'demo' else (
            r'features\.\d')
    warmup = INTERVAL  # the first interval: allocations, first publication
    ratios, estimates, costs, reported, plain_ms = [], [], [], [], []
    positional: List[float] = []
    for _ in range(args.repeats):  # interleaved: drifts hit both alike
        plain = train(
            args.iters, None, args.batch_size,
            model=args.model)['times'][warmup:]
        hooked = train(args.iters, args.modules, args.batch_size, args.stats,
                       args.model)
        times = hooked['times'][warmup:]
        ratios.append(sum(times) / sum(plain))
        # Per position in the publication interval (iteration % INTERVAL):
        # median time with and without the hook. Catches the cost wherever
        # it lands (the publication of the extra names is timed in the
        # iteration after the instrumented one) without the noise of sums.
        by_pos = [
            statistics.median(times[pos::INTERVAL]) -
            statistics.median(plain[pos::INTERVAL]) for pos in range(INTERVAL)
        ]
        positional.append(sum(by_pos) / (INTERVAL * statistics.median(plain)))
        instrumented = [
            t for i, t in enumerate(times, warmup + 1) if i % INTERVAL == 0
        ]
        others = [t for i, t in enumerate(times, warmup + 1) if i % INTERVAL]
        extra = statistics.median(instrumented) - statistics.median(others)
        estimates.append(extra / (INTERVAL * statistics.median(plain)))
        costs.append(extra * 1e3)
        reported.append(statistics.median(hooked['instrument_ms'][1:]))
        plain_ms.append(statistics.median(plain) * 1e3)
    device = 'cuda' if torch.cuda.is_available() else 'cpu, 1 thread'
    what = ('the digits demo (ResNet-mini, batch 64)' if args.model == 'demo'
            else f'a conv/BN net, batch {args.batch_size}')
    print(f'## ModuleStatsHook(modules={args.modules!r}, stats='
          f'{tuple(args.stats)}) on {what}, {args.iters} iterations, '
          'interval '
          f'{INTERVAL}, {device}, median of {args.repeats} interleaved '
          'repeats')
    rows = [
        ('iteration time without the hook (ms)',
         f'{statistics.median(plain_ms):8.3f}'),
        ('overhead on training time, with / without hook',
         f'{100 * (statistics.median(ratios) - 1):7.2f}%'),
        ('overhead, per-position medians (with - without) / without',
         f'{100 * statistics.median(positional):7.2f}%'),
        ('overhead estimated from the instrumented iterations',
         f'{100 * statistics.median(estimates):7.2f}%'),
        ('instrumented iteration: extra time vs others (ms)',
         f'{statistics.median(costs):8.3f}'),
        ('instrumented iteration: instrument_ms reported (ms)',
         f'{statistics.median(reported):8.3f}'),
    ]
    for label, value in rows:
        print(f'{label:58s} {value}')


if __name__ == '__main__':
    main()
