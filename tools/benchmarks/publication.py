"""What a StatsCollectorHook publication costs beside its visualizer write.

A real mmengine Runner (one process, an iteration-based loop, LocalVisBackend
writing ``scalars.json``) whose model reports N Python floats per iteration
(N = 10, 100, 1000), StatsCollectorHook publishing after every iteration
with its default statistics (``mean``, ``std``, ``min``, ``max``: 4 N
keys). Per publication it times the hook's ``after_train_iter`` (the
collector's update, the checks, the formatting, the message hub, the
visualizer) and, inside it, the ``Visualizer.add_scalars`` call of the same
keys, and prints the medians and their ratio: the hook's publication /
its visualizer write (1.0x would be a publication that costs nothing but
the write). The sizes take turns (``--rounds`` runs each), so that a load
that comes and goes falls on all of them.

Usage: ``python tools/benchmarks/publication.py [--iters I] [--rounds R]``
"""
import argparse
import statistics
import tempfile
import time
from typing import Dict, List

import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn

from mmstats.stats import report


class _Reporting(BaseModel):
    """A linear model that reports ``names`` floats per forward."""

    def __init__(self, names: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.names = [f'value/{i:04d}' for i in range(names)]

    def forward(self, inputs, mode: str = 'tensor'):
        loss = self.linear(inputs).pow(2).mean()
        for i, name in enumerate(self.names):
            report(name, float(i))
        return dict(loss=loss) if mode == 'loss' else loss


class _Data(torch.utils.data.Dataset):

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        return dict(inputs=torch.full((2, ), float(i)))


def reporting_runner(work_dir: str,
                     names: int,
                     iters: int,
                     hook: dict,
                     logger_interval: int = 1) -> Runner:
    """A real Runner (iteration-based, LocalVisBackend) whose model reports
    ``names`` Python floats per iteration, with StatsCollectorHook
    ``hook`` (also used by ``tools/analysis/report_path.py``)."""
    return Runner(
        model=_Reporting(names),
        work_dir=work_dir,
        experiment_name=f'reporting_{names}_{time.time_ns()}',
        train_dataloader=dict(
            dataset=_Data(),
            sampler=dict(type='InfiniteSampler', shuffle=False),
            batch_size=4,
            collate_fn=dict(type='default_collate'),
            num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.0)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=logger_interval),
            checkpoint=dict(type='CheckpointHook', interval=10**9)),
        custom_hooks=[dict(type='mmstats.StatsCollectorHook', **hook)],
        visualizer=dict(
            type='Visualizer', vis_backends=[dict(type='LocalVisBackend')]),
        log_level='WARNING')


def run(names: int, iters: int) -> Dict[str, List[float]]:
    """Train ``iters`` iterations; seconds of each publication and of its
    ``add_scalars`` call (the first two publications left out)."""
    with tempfile.TemporaryDirectory() as work_dir:
        runner = reporting_runner(work_dir, names, iters,
                                  dict(interval=1, max_names=2 * names + 10))
        hook = next(
            h for h in runner.hooks
            if type(h).__name__ == 'StatsCollectorHook')
        times: Dict[str, List[float]] = dict(publication=[], add_scalars=[])
        runner.visualizer  # built
        add_scalars = runner.visualizer.add_scalars

        def timed_add_scalars(*args, **kwargs):
            start = time.perf_counter()
            add_scalars(*args, **kwargs)
            times['add_scalars'].append(time.perf_counter() - start)

        runner.visualizer.add_scalars = timed_add_scalars
        after = hook.after_train_iter

        def timed_after(*args, **kwargs):
            start = time.perf_counter()
            after(*args, **kwargs)
            times['publication'].append(time.perf_counter() - start)

        hook.after_train_iter = timed_after
        runner.train()
    return {key: values[2:] for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--iters', type=int, default=40)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument(
        '--names', type=int, nargs='+', default=[10, 100, 1000])
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.iters, args.rounds, args.names = 3, 1, [10]
    torch.set_num_threads(1)
    results = {n: dict(publication=[], add_scalars=[]) for n in args.names}
    for _ in range(args.rounds):
        for names in args.names:
            for key, values in run(names, args.iters).items():
                results[names][key] += values
    print('StatsCollectorHook publication (interval=1, 4 statistics per '
          'name) beside its Visualizer.add_scalars call, medians, ms')
    print(f'{"names":>6} {"keys":>6} {"publication":>12} {"add_scalars":>12}'
          f' {"ratio":>7}')
    for names, times in results.items():
        pub = statistics.median(times['publication']) * 1e3
        vis = statistics.median(times['add_scalars']) * 1e3
        print(f'{names:>6} {4 * names:>6} {pub:>12.3f} {vis:>12.3f} '
              f'{pub / vis:>6.2f}x')


if __name__ == '__main__':
    main()
