"""Benchmark of ModuleStatsHook's health options on the digits demo:
``optimizer_state=True`` (norms of the optimizer's moments on the
instrumented iterations) and ``watch_nonfinite=True`` (a NaN/inf check of
every matched module's outputs and gradients on every iteration).

Trains the iteration-based digits demo (ResNet-mini, batch 64, LoggerHook
interval 10, ``projects/digits_demo``) in real Runners, with
StatsCollectorHook and ``ModuleStatsHook(modules=<the demo's stem, stages
and head>)`` in every setup, and each option switched on alone; setups
alternate in every repeat (interleaved) and the ratios are medians over
the repeats. Prints side by side, per setup: the median iteration time,
the whole-run time ratio to the baseline (the hook with both options off)
and the per-position estimate (median time at each position of the
publication interval, with minus without, summed: it catches a cost
wherever it lands). ``--optimizer adamw`` trains with AdamW (exp_avg and
exp_avg_sq) instead of the demo's SGD with momentum (momentum_buffer).

Usage: ``python tools/benchmarks/health_module.py [--iters N]
[--repeats R] [--optimizer sgd|adamw]``
"""
import argparse
import os.path as osp
import statistics
import sys
from typing import Dict, List

import torch
from mmengine.utils import ManagerMixin

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from module_stats import DEMO_MODULES, INTERVAL, demo_runner  # noqa: E402

SETUPS = {
    'StatsCollectorHook alone': None,
    'ModuleStatsHook, options off (baseline)': {},
    'optimizer_state=True': dict(optimizer_state=True),
    'watch_nonfinite=True': dict(watch_nonfinite=True),
}
BASELINE = 'ModuleStatsHook, options off (baseline)'


def train(iters: int, options, optimizer: str) -> List[float]:
    """Per-iteration times (s) of one demo run."""
    hooks = [dict(type='mmstats.StatsCollectorHook')]
    if options is not None:
        hooks.append(
            dict(
                type='mmstats.ModuleStatsHook',
                modules=DEMO_MODULES,
                **options))
    runner = demo_runner(iters, hooks)
    if optimizer == 'adamw':
        from mmengine.optim import build_optim_wrapper
        runner.optim_wrapper = build_optim_wrapper(
            runner.model,
            dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)))
    runner.train()
    times = list(runner.message_hub.get_scalar('train/time').data[0])
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--optimizer', choices=['sgd', 'adamw'], default='sgd')
    args = parser.parse_args()
    torch.set_num_threads(1)
    warmup = INTERVAL  # the first interval: allocations, first publication
    runs: Dict[str, List[List[float]]] = {name: [] for name in SETUPS}
    for repeat in range(args.repeats):  # interleaved, order rotated
        names = list(SETUPS)
        names = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in names:
            runs[name].append(
                train(args.iters, SETUPS[name], args.optimizer)[warmup:])
    device = 'cuda' if torch.cuda.is_available() else 'cpu, 1 thread'
    print(f'## digits demo ({args.optimizer}), {args.iters} iterations, '
          f'interval {INTERVAL}, {device}, medians of {args.repeats} '
          'interleaved repeats; ratios to the baseline')
    print(f'{"setup":42s} {"ms/iter":>8s} {"whole run":>10s} '
          f'{"per position":>13s}')
    for name in SETUPS:
        ratios, positional = [], []
        for times, base in zip(runs[name], runs[BASELINE]):
            ratios.append(sum(times) / sum(base))
            by_pos = [
                statistics.median(times[pos::INTERVAL]) -
                statistics.median(base[pos::INTERVAL])
                for pos in range(INTERVAL)
            ]
            positional.append(
                sum(by_pos) / (INTERVAL * statistics.median(base)))
        ms = statistics.median(t for times in runs[name] for t in times) * 1e3
        print(f'{name:42s} {ms:8.3f} '
              f'{100 * (statistics.median(ratios) - 1):+9.2f}% '
              f'{100 * statistics.median(positional):+12.2f}%')


if __name__ == '__main__':
    main()
