"""Cost of ModuleStatsHook's disarmed activation probes under
``torch.compile``: a compiled 4 x [Linear, ReLU] net (batch 32, width 64),
with and without one probe per block, and the bare call of the
``mmstats::module_act`` op.

Setups alternate in every repeat; prints the median time per call.
Usage: ``python tools/benchmarks/module_act_compile.py [--repeats R]``
"""
import argparse
import statistics
import time

import torch
from torch import nn

from mmstats.hooks.module_act import ActivationProbes


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--calls', type=int, default=2000)
    parser.add_argument('--backend', default='inductor')
    args = parser.parse_args()
    x = torch.randn(32, 64)
    times = {'without probes': [], 'with 4 probes': [], 'bare op': []}
    op = torch.ops.mmstats.module_act.default
    for _ in range(args.repeats):
        for probed in (False, True):
            torch._dynamo.reset()
            net = nn.Sequential(*[
                nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)
            ])
            probes = None
            if probed:
                probes = ActivationProbes({str(i): net[i]
                                           for i in range(4)}, 'modules')
            compiled = torch.compile(net, backend=args.backend)
            with torch.no_grad():
                for _ in range(20):  # compile and warm up
                    compiled(x)
                key = 'with 4 probes' if probed else 'without probes'
                times[key].append(per_call_us(lambda: compiled(x), args.calls))
            if probes is not None:
                probes.remove()
        times['bare op'].append(
            per_call_us(lambda: op(x, -1, 'x'), args.calls))
    for key, values in times.items():
        print(f'{key:>16}: {statistics.median(values):8.1f} us per call')


if __name__ == '__main__':
    main()
