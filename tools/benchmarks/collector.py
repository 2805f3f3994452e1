"""Benchmark Collector.update() on 2/4/8 gloo processes and its name bound.

Prints, per world size, the median time of ``update()`` with 200 names
beside the same collectives run bare (no Collector around them) and the
old design's all_gather of ``1 + 6 x names`` float64, plus the bytes each
rank sends and receives (ring all_reduce: ``2 (W-1)/W`` x payload each way;
all_gather: payload out to ``W-1`` peers, ``(W-1)`` x payload in). Then, in
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
F64_BYTES = 8


def _worker(rank, world, repeats):
    names = [f'stat/{i}' for i in range(NAMES)]
    collector = Collector()
    sizes = []
    orig = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sizes.append(tensor.numel())
        return orig(tensor, *args, **kwargs)

    def one_update():
        for name in names:
            report(name, float(rank))
        start = time.perf_counter()
        collector.update()
        return time.perf_counter() - start

    one_update()  # the table settles
    dist.all_reduce = counting
    one_update()
    dist.all_reduce = orig
    bare = [torch.zeros(n, dtype=torch.float64) for n in sizes]
    gathered = [torch.zeros(1 + 6 * NAMES, dtype=torch.float64)] * world
    old_payload = torch.zeros(1 + 6 * NAMES, dtype=torch.float64)
    times = {'update': [], 'bare': [], 'old gather': []}
    for _ in range(repeats):  # interleaved repeats
        times['update'].append(one_update())
        dist.barrier()
        start = time.perf_counter()
        for tensor in bare:
            dist.all_reduce(tensor)
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
    args = parser.parse_args()
    print(f'Collector.update(), {NAMES} names, medians of {args.repeats}')
    print(f'{"ranks":>5} {"update ms":>10} {"bare ms":>8} '
          f'{"old gather ms":>14} {"new B out/in":>14} {"old B in":>10}')
    for world in args.worlds:
        results = run_distributed(_worker, world, args.repeats, timeout=600)
        times, sizes = results[0]
        payload = sum(sizes) * F64_BYTES
        ring = 2 * (world - 1) / world * payload
        old_in = (world - 1) * (1 + 6 * NAMES) * F64_BYTES
        print(f'{world:>5} {times["update"] * 1e3:>10.3f} '
              f'{times["bare"] * 1e3:>8.3f} '
              f'{times["old gather"] * 1e3:>14.3f} '
              f'{ring:>14.0f} {old_in:>10.0f}   '
              f'(collectives {sizes} float64)')
    times, sizes = _bounded_names()
    first, last = np.median(times[1:6]), np.median(times[-5:])
    print(f'5000 names, one per step, update every 10 steps, max_names=1000:'
          f' table <= {max(sizes)} names; first updates {first * 1e6:.0f} '
          f'us, last {last * 1e6:.0f} us ({last / first:.1f}x)')


if __name__ == '__main__':
    main()
