"""The hook-overhead part of ``gpu.py``: a real mmengine Runner training a
ResNet-50 with AMP on one GPU, with and without mmstats' hooks.

The images live on the GPU (one fixed batch), so an iteration is the
model's forward, backward and optimizer step plus the Runner's own hooks
(IterTimerHook, LoggerHook at interval 10, ...): what the hooks add is not
hidden behind data loading. The model reports, like a user's would, the
loss and the per-sample feature norm (no-ops without a Collector).
"""
import math
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmstats import report

BATCH = 64
WARMUP = 10  # iterations before the timed span (cudnn autotuning, ...)


@DATASETS.register_module(force=True)
class GpuBenchIndices(Dataset):
    """Sample indices only: the images are a fixed GPU batch."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> dict:
        return dict(inputs=torch.tensor(idx))


@MODELS.register_module(force=True)
class GpuBenchResNet(BaseModel):
    """``backbone`` (a ResNet-50) trained on one fixed random GPU batch."""

    build_backbone: Callable = None  # set by hook_overhead

    def __init__(self) -> None:
        super().__init__()
        self.backbone = self.build_backbone()
        gen = torch.Generator().manual_seed(0)
        self.register_buffer(
            'images',
            torch.randn(BATCH, 3, 224, 224, generator=gen),
            persistent=False)
        self.register_buffer(
            'labels',
            torch.randint(0, 1000, (BATCH, ), generator=gen),
            persistent=False)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        logits = self.backbone(self.images)
        report('model/logit_norm', logits.detach().float().norm(dim=1))
        if mode == 'loss':
            return dict(loss=F.cross_entropy(logits, self.labels))
        return logits


@HOOKS.register_module(force=True)
class SpanTimerHook(Hook):
    """Seconds from the end of iteration ``WARMUP`` to the end of the last
    one (two synchronisations per run, in every configuration)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.start = self.seconds_per_iter = None

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if runner.iter + 1 == WARMUP:
            torch.cuda.synchronize()
            self.start = time.perf_counter()
        elif runner.iter + 1 == runner.max_iters:
            torch.cuda.synchronize()
            self.seconds_per_iter = (time.perf_counter() - self.start) / (
                runner.max_iters - WARMUP)


def _run(work_dir: str, iters: int, hooks: List[dict], tag: str) -> float:
    runner = Runner(
        model=dict(type='GpuBenchResNet'),
        work_dir=work_dir,
        experiment_name=f'{tag}_{time.time_ns()}',
        train_dataloader=dict(
            batch_size=BATCH,
            num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate'),
            dataset=dict(type='GpuBenchIndices', length=BATCH * iters)),
        optim_wrapper=dict(
            type='AmpOptimWrapper',
            optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=iters),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=10**6)),
        log_processor=dict(by_epoch=False),
        custom_hooks=hooks + [dict(type='SpanTimerHook')],
        env_cfg=dict(cudnn_benchmark=False),
        log_level='ERROR',
        default_scope=None)
    runner.train()
    timer = [h for h in runner.hooks if isinstance(h, SpanTimerHook)][0]
    return timer.seconds_per_iter


def _configs(all_configs: bool = False) -> Dict[str, List[dict]]:
    stats = dict(type='mmstats.StatsCollectorHook')
    module_stats = dict(
        type='mmstats.ModuleStatsHook', modules=r'backbone\.layer\d')
    # ModuleStatsHook instruments the iterations StatsCollectorHook publishes
    configs = {
        'no mmstats hook': [],
        'StatsCollectorHook (interval 10)': [stats],
        '+ ModuleStatsHook (interval 10)': [stats, module_stats],
    }
    if all_configs:
        configs['StatsCollectorHook (interval 1)'] = [dict(stats, interval=1)]
        configs['+ ModuleStatsHook (interval 1)'] = [
            dict(stats, interval=1), module_stats
        ]
    return configs


def hook_overhead(build_backbone: Callable,
                  iters: int,
                  repeats: int,
                  all_configs: bool = False) -> None:
    """Print seconds per iteration and overhead of each configuration
    (``repeats`` paired rounds of interleaved runs)."""
    GpuBenchResNet.build_backbone = staticmethod(build_backbone)
    # no autotuner: every Runner gets the same convolution algorithms
    torch.backends.cudnn.benchmark = False
    configs = _configs(all_configs)
    print(f'\n== Runner, ResNet-50 AMP batch {BATCH}: seconds per '
          f'iteration over iterations {WARMUP + 1}-{iters} (median of '
          f'{repeats} interleaved runs) ==')
    times: Dict[str, List[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as work_dir:
        for _ in range(repeats):
            for name, hooks in configs.items():
                times[name].append(_run(work_dir, iters, hooks, 'bench'))
    print_overheads(times)


def paired_overhead(values: List[float],
                    base_runs: List[float]) -> Tuple[float, float, float]:
    """Mean paired overhead (run ``i`` over run ``i`` without hooks, so
    slow drift between rounds cancels) and its 95% confidence interval
    (Student's t on the paired log ratios), as fractions."""
    logs = [math.log(v / b) for v, b in zip(values, base_runs)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.expm1(mean), math.nan, math.nan
    half = _T975.get(len(logs) - 1, 1.96) * statistics.stdev(logs) / (
        math.sqrt(len(logs)))
    return math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half)


# Student's t, 97.5% quantile, by degrees of freedom (normal beyond 30).
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042
}


def print_overheads(times: Dict[str, List[float]]) -> None:
    """Median seconds per iteration of each configuration and its paired
    overhead over the runs without hooks, with a 95% confidence
    interval."""
    base_runs = times['no mmstats hook']
    print(f'{len(base_runs)} paired rounds')
    for name, values in times.items():
        med = statistics.median(values)
        mean, low, high = paired_overhead(values, base_runs)
        print(f'{name:>34}: {med * 1e3:8.2f} ms/iter  paired overhead '
              f'{mean * 100:+6.2f}% (95% CI {low * 100:+.2f}% .. '
              f'{high * 100:+.2f}%)')
