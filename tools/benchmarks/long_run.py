"""A long run stays flat: StatsCollectorHook at interval 1 over many
iterations with many names (quantile sketches on).

Drives the hook as a Runner does (``before_run``, ``after_train_iter`` per
iteration with ``train_step``'s outputs, timing and ``names`` reported
values) with a real MessageHub and a Visualizer without backends (writing
scalars.json at interval 1 with thousands of keys measures the disk), and
prints the median time per iteration and the resident memory over the first
and the last ``--window`` iterations, and tracemalloc's growth between them.

Usage: ``python tools/benchmarks/long_run.py [--iters 100000] [--names 1000]``
"""
import argparse
import os
import sys
import time
import tracemalloc
from unittest.mock import MagicMock

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))

from mmengine.logging import MessageHub  # noqa: E402
from mmengine.runner import IterBasedTrainLoop  # noqa: E402
from mmengine.visualization import Visualizer  # noqa: E402

from mmstats.hooks import StatsCollectorHook  # noqa: E402
from mmstats.stats import report  # noqa: E402


def rss_mb() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--iters', type=int, default=100000)
    parser.add_argument('--names', type=int, default=1000)
    parser.add_argument('--window', type=int, default=1000)
    parser.add_argument('--no-sketch', action='store_true')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.iters, args.names, args.window = 20, 10, 10
    torch.set_num_threads(1)
    stats = ('mean', 'std', 'min', 'max') + (() if args.no_sketch else
                                             ('p50', 'p99'))
    hook = StatsCollectorHook(
        interval=1, stats=stats, max_names=args.names + 10)
    runner = MagicMock()
    runner.train_loop = MagicMock(spec=IterBasedTrainLoop)
    runner.max_iters = args.iters
    runner.hooks = []
    runner.log_processor.num_digits = 4
    runner.message_hub = MessageHub.get_instance('long_run')
    runner.visualizer = Visualizer.get_instance('long_run')
    hook.before_run(runner)
    tracemalloc.start()  # from the start: both windows pay its overhead
    names = [f'model/stat{i}' for i in range(args.names)]
    # positive, like losses and norms (values straddling zero cost more:
    # docs/quantiles.md)
    values = torch.rand(args.names, 8, dtype=torch.float64) + 0.1
    times = []
    rss = {}
    for it in range(args.iters):
        start = time.perf_counter()
        runner.iter = it
        runner.message_hub.update_scalar('train/time', 0.01)
        for i, name in enumerate(names):
            report(name, values[i])
        hook.after_train_iter(
            runner, it, outputs=dict(loss=torch.tensor(float(it % 7))))
        times.append(time.perf_counter() - start)
        if it + 1 == args.window:
            rss['first'] = rss_mb()
            snapshot = tracemalloc.take_snapshot()
    grown = sum(
        s.size_diff
        for s in tracemalloc.take_snapshot().compare_to(snapshot, 'filename'))
    tracemalloc.stop()
    first = np.median(times[:args.window]) * 1e3
    last = np.median(times[-args.window:]) * 1e3
    print(f'{args.iters} iterations, {args.names} names, stats {stats}')
    print(f'median ms per iteration: first {args.window}: {first:.2f}, '
          f'last {args.window}: {last:.2f} (ratio {last / first:.2f})')
    print(f'resident MB after the first {args.window}: {rss["first"]:.1f}, '
          f'at the end: {rss_mb():.1f}')
    print(f'tracemalloc growth from iteration {args.window} to the end: '
          f'{grown / 1024:.1f} KiB')


if __name__ == '__main__':
    main()
