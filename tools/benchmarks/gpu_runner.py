"""The hook-overhead part of ``gpu.py``: a real mmengine Runner training a
ResNet-50 with AMP on one GPU, with and without mmstats' hooks.

The images live on the GPU (one fixed batch), so an iteration is the
model's forward, backward and optimizer step plus the Runner's own hooks
(IterTimerHook, LoggerHook at interval 10, ...): what the hooks add is not
hidden behind data loading. The model reports, like a user's would, the
loss and the per-sample feature norm (no-ops without a Collector).
"""
import statistics
import tempfile
import time
from typing import Callable, Dict, List

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


def _configs() -> Dict[str, List[dict]]:
    stats = dict(type='mmstats.StatsCollectorHook')
    configs = {
        'no mmstats hook': [],
        'StatsCollectorHook (interval 10)': [stats],
        'StatsCollectorHook (interval 1)': [dict(stats, interval=1)],
    }
    module_stats = dict(
        type='mmstats.ModuleStatsHook', modules=r'backbone\.layer\d')
    # ModuleStatsHook instruments the iterations StatsCollectorHook publishes
    configs['+ ModuleStatsHook (interval 10)'] = [stats, module_stats]
    configs['+ ModuleStatsHook (interval 1)'] = [
        dict(stats, interval=1), module_stats
    ]
    return configs


def hook_overhead(build_backbone: Callable, iters: int, repeats: int) -> None:
    """Print seconds per iteration and overhead of each configuration
    (interleaved runs, median over ``repeats``)."""
    GpuBenchResNet.build_backbone = staticmethod(build_backbone)
    # no autotuner: every Runner gets the same convolution algorithms
    torch.backends.cudnn.benchmark = False
    configs = _configs()
    print(f'\n== Runner, ResNet-50 AMP batch {BATCH}: seconds per '
          f'iteration over iterations {WARMUP + 1}-{iters} (median of '
          f'{repeats} interleaved runs) ==')
    times: Dict[str, List[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as work_dir:
        for _ in range(repeats):
            for name, hooks in configs.items():
                times[name].append(_run(work_dir, iters, hooks, 'bench'))
    print_overheads(times)


def print_overheads(times: Dict[str, List[float]]) -> None:
    """Median seconds per iteration of each configuration, its overhead
    over the median without hooks, and the median of the paired ratios
    (run ``i`` of a configuration over run ``i`` without hooks: slow drift
    of the GPU's speed between rounds cancels)."""
    base_runs = times['no mmstats hook']
    base = statistics.median(base_runs)
    for name, values in times.items():
        med = statistics.median(values)
        paired = statistics.median(v / b for v, b in zip(values, base_runs))
        runs = ', '.join(f'{v * 1e3:.2f}' for v in values)
        print(f'{name:>34}: {med * 1e3:8.2f} ms/iter  overhead '
              f'{(med / base - 1) * 100:+6.2f}%  paired '
              f'{(paired - 1) * 100:+6.2f}%  (runs: {runs})')
