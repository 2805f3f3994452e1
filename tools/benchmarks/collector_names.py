"""Benchmark: Collector.update() time while names keep changing.

5000 distinct names reported one per step, ``update()`` every 10 steps,
``Collector(max_names=1000, evict_after=100)`` (the scenario of
``tests/test_stats/test_collector.py::
test_names_stay_bounded_and_updates_stay_cheap``, which asserts the
bounded collectives and numbers; the timing lives here because a test's
verdict must not depend on the machine's load).

Prints the median ``update()`` time of updates 2-6 (small table), of the
last 5 (full table) and their ratio, measured in this one run (CPU, one
thread).

Usage: ``python tools/benchmarks/collector_names.py [--names N]``
"""
import argparse
import statistics
import time

import torch

from mmstats import Collector, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--names', type=int, default=5000)
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.names = 100
    torch.set_num_threads(1)
    c = Collector(max_names=1000, evict_after=100)
    times = []
    for step in range(args.names):
        report(f'sample/{step}', float(step))
        if step % 10 == 9:
            start = time.perf_counter()
            c.update()
            times.append(time.perf_counter() - start)
    first = statistics.median(times[1:6])
    last = statistics.median(times[-5:])
    print(f'update() with a small table: {first * 1e6:.0f} us; with '
          f'{len(c.names())} names: {last * 1e6:.0f} us '
          f'({last / first:.1f}x)')


if __name__ == '__main__':
    main()
