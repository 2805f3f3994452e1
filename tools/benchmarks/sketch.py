"""Benchmark of the quantile sketches (``Collector(sketch=True)``).

Prints, measured in this one run (CPU, ``torch.set_num_threads(1)``,
medians of ``--repeats`` interleaved runs, sketch off / on):

1. ``report()`` of one float32 tensor of 2^16 and 2^20 randn values (reduced
   at report time: moments row + device sketch window);
2. ``Collector.update()`` on one process for N names (100 and 1000), each
   with 20 float values around a level in [0.1, 10] (loss-like), and for N
   names of 2^16 randn values each (mixed sign, 5 decades);
3. the bytes one update sends per rank (all SUM collectives) and the bytes
   of the published sketches, per name.

Usage: ``python tools/benchmarks/sketch.py [--repeats R]``
"""
import argparse
import gc
import statistics
import time

import numpy as np
import torch

from mmstats.stats import Collector, report
from mmstats.stats.protocol import ReduceFns


class SumBytes(ReduceFns):
    """One process; counts the bytes of every SUM."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def all_reduce_sum(self, x):
        self.bytes += x.nbytes
        return super().all_reduce_sum(x)


def time_report(numel: int, sketch: bool, calls: int = 10) -> float:
    collector = Collector(sketch=sketch)
    x = torch.randn(numel)
    report('x', x)  # warm-up
    collector.update()
    start = time.perf_counter()
    for _ in range(calls):
        report('x', x)
    elapsed = (time.perf_counter() - start) / calls
    collector.update()
    return elapsed


def time_update(names: int, kind: str, sketch: bool) -> tuple:
    fns = SumBytes()
    collector = Collector(reduce_fns=fns, sketch=sketch, max_names=4096)
    rng = np.random.default_rng(0)
    levels = np.exp(rng.uniform(np.log(0.1), np.log(10), names))

    def fill():
        for i, level in enumerate(levels):
            if kind == 'loss':
                for v in (level * rng.uniform(0.8, 1.25, 20)).tolist():
                    report(f'n{i:04d}', v)
            else:
                report(f'n{i:04d}', torch.randn(2**16))

    fill()
    collector.update()  # admits the names
    fill()
    fns.bytes = 0
    start = time.perf_counter()
    collector.update()
    elapsed = time.perf_counter() - start
    published = collector.sketch_bytes()
    return elapsed, fns.bytes, published


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    torch.set_num_threads(1)
    for numel in (2**10, ) if args.smoke else (2**16, 2**20):
        runs = {False: [], True: []}
        for _ in range(args.repeats):
            for sketch in (False, True):
                runs[sketch].append(time_report(numel, sketch))
                gc.collect()
        off, on = (statistics.median(runs[s]) * 1e3 for s in (False, True))
        print(f'report() of {numel} randn: {off:.3f} / {on:.3f} ms')
    counts = ((10, ), (10, )) if args.smoke else ((100, 1000), (100, ))
    for kind, counts in zip(('loss', 'randn'), counts):
        for names in counts:
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for sketch in (False, True):
                    runs[sketch].append(time_update(names, kind, sketch))
                    gc.collect()
            off, on = (
                statistics.median(r[0] for r in runs[s]) * 1e3
                for s in (False, True))
            sent_off, sent_on = runs[False][0][1], runs[True][0][1]
            published = runs[True][0][2]
            print(f'update() of {names} {kind} names: {off:.2f} / {on:.2f}'
                  f' ms; SUM bytes per rank {sent_off} / {sent_on} '
                  f'({(sent_on - sent_off) / names:.0f} per name); '
                  f'published sketches {published / names:.0f} B per name')


if __name__ == '__main__':
    main()
