"""Benchmark Collector.update() on 2/4/8 gloo processes and its name bound.

Prints, per world size, the median time of ``update()`` with 200 names
(interleaved repeats) beside the same collectives run bare (no Collector
around them) and the old design's all_gather of ``1 + 6 x names`` float64,
the ratio ours / old, and the collectives one steady-state update issues
(up to ``GATHER_MAX_WORLD`` ranks one all_gather, beyond it three
all_reduces of a payload flat in the world size). Then, in
one process, the first and last updates of 5000 names reported one per
step with ``update()`` every 10 steps and ``max_names=1000``.

Usage: ``python tools/benchmarks/collector.py [--worlds 2 4 8]``
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))

from mmstats.stats import Collector, report  # noqa: E402
from tests.helpers.dist import run_distributed  # noqa: E402

NAMES = 200
REPEATS = 30


def _worker(rank, world, repeats):
    names = [f'stat/{i}' for i in range(NAMES)]
    collector = Collector()
    sizes = []
    orig = dist.all_reduce
    orig_gather = dist.all_gather

    def counting(tensor, *args, **kwargs):
        sizes.append(('all_reduce', tensor.numel()))
        return orig(tensor, *args, **kwargs)

    def counting_gather(out, tensor, *args, **kwargs):
        sizes.append(('all_gather', tensor.numel()))
        return orig_gather(out, tensor, *args, **kwargs)

    def one_update():
        for name in names:
            report(name, float(rank))
        dist.barrier()  # rank skew is not update()'s cost
        start = time.perf_counter()
        collector.update()
        return time.perf_counter() - start

    one_update()  # the table settles
    dist.all_reduce, dist.all_gather = counting, counting_gather
    one_update()
    dist.all_reduce, dist.all_gather = orig, orig_gather

    def bare_collectives():
        for kind, n in sizes:
            tensor = torch.zeros(n, dtype=torch.float64)
            if kind == 'all_reduce':
                dist.all_reduce(tensor)
            else:
                dist.all_gather([torch.empty_like(tensor)] * world, tensor)

    gathered = [torch.zeros(1 + 6 * NAMES, dtype=torch.float64)] * world
    old_payload = torch.zeros(1 + 6 * NAMES, dtype=torch.float64)
    times = {'update': [], 'bare': [], 'old gather': []}
    for _ in range(repeats):  # interleaved repeats
        times['update'].append(one_update())
        dist.barrier()
        start = time.perf_counter()
        bare_collectives()
        times['bare'].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        dist.all_gather(list(map(torch.empty_like, gathered)), old_payload)
        times['old gather'].append(time.perf_counter() - start)
        dist.barrier()
    return {k: float(np.median(v)) for k, v in times.items()}, sizes


def _bounded_names(total=5000, every=10):
    collector = Collector(max_names=1000, evict_after=100)
    times, sizes = [], []
    for step in range(total):
        report(f'sample/{step}', float(step))
        if step % every == every - 1:
            start = time.perf_counter()
            collector.update()
            times.append(time.perf_counter() - start)
            sizes.append(len(collector.names()))
    return times, sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--worlds', type=int, nargs='+', default=[2, 4, 8])
    parser.add_argument('--repeats', type=int, default=REPEATS)
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.worlds, args.repeats = [2], 2
    print(f'Collector.update(), {NAMES} names, medians of {args.repeats}')
    print(f'{"ranks":>5} {"update ms":>10} {"bare ms":>8} '
          f'{"old gather ms":>14} {"ours/old":>9}  collectives (float64)')
    for world in args.worlds:
        results = run_distributed(_worker, world, args.repeats, timeout=600)
        times, sizes = results[0]
        print(f'{world:>5} {times["update"] * 1e3:>10.3f} '
              f'{times["bare"] * 1e3:>8.3f} '
              f'{times["old gather"] * 1e3:>14.3f} '
              f'{times["update"] / times["old gather"]:>8.2f}x  {sizes}')
    total = 200 if args.smoke else 5000
    times, sizes = _bounded_names(total)
    first, last = np.median(times[1:6]), np.median(times[-5:])
    print(
        f'{total} names, one per step, update every 10 steps, '
        f'max_names=1000: table <= {max(sizes)} names; first updates '
        f'{first * 1e6:.0f} us, last {last * 1e6:.0f} us ({last / first:.1f}x)'
    )


if __name__ == '__main__':
    main()
