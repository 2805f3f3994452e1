"""Cost of ModuleStatsHook's disarmed activation probes under
``torch.compile``: a compiled 4 x [Linear, ReLU] net (batch 32, width 64)
without probes, with one probe per block (the chosen design: a custom op
whose kernel reads the flag), and with the two alternatives: a hook that
reads the flag while dynamo traces (``guarded``: no op when off, but a
graph per flag state) and a ``torch.compiler.disable``d hook (``graph
break`` at every probed module); plus the bare call of the
``mmstats::module_act`` op. Each setup is run disarmed, then armed once,
then disarmed again: the graphs dynamo compiled are counted.

Setups alternate in every repeat; prints the median time per call.
Usage: ``python tools/benchmarks/module_act_compile.py [--repeats R]``
"""
import argparse
import statistics
import time

import torch
from torch import nn
from torch._dynamo.utils import counters

from mmstats import Collector, report
from mmstats.module_stats import ActivationProbes


class Flag:
    armed = False


def alternative_hook(flag: Flag, key: str, kind: str):
    """The rejected designs, for comparison."""

    def guarded(module, args, output):
        if flag.armed:  # read while tracing: dynamo guards on it
            report(key, output.detach())

    @torch.compiler.disable
    def graph_break(module, args, output):
        if flag.armed:
            report(key, output.detach())

    return guarded if kind == 'guarded' else graph_break


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def make_net(kind: str):
    """The net and the object whose ``armed`` switches its probes."""
    torch.manual_seed(0)
    net = nn.Sequential(
        *[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)])
    if kind == 'op (chosen)':
        return net, ActivationProbes({str(i): net[i]
                                      for i in range(4)}, 'modules')
    flag = Flag()
    if kind != 'no probes':
        for i in range(4):
            net[i].register_forward_hook(
                alternative_hook(flag, f'modules/{i}/act', kind))
    return net, flag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--calls', type=int, default=1000)
    parser.add_argument('--backend', default='inductor')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.calls, args.backend = 1, 10, 'eager'
    x = torch.randn(32, 64)
    kinds = ('no probes', 'op (chosen)', 'guarded', 'graph break')
    times = {kind: [] for kind in kinds}
    graphs = {}
    collector = Collector('modules/.*')
    for _ in range(args.repeats):
        for kind in kinds:
            torch._dynamo.reset()
            counters.clear()
            net, flag = make_net(kind)
            compiled = torch.compile(net, backend=args.backend)
            with torch.no_grad():
                for armed in (False, True, False):  # compile every state
                    flag.armed = armed
                    compiled(x)
                times[kind].append(
                    per_call_us(lambda: compiled(x), args.calls))
            graphs[kind] = counters['stats']['unique_graphs']
            if isinstance(flag, ActivationProbes):
                flag.remove()
            collector.update()
    op = torch.ops.mmstats.module_act.default
    bare = per_call_us(lambda: op(x, -1, 'x'), args.calls * 10)
    for kind in kinds:
        print(f'{kind:>12}: {statistics.median(times[kind]):8.1f} us per '
              f'call (disarmed), {graphs[kind]} graph(s) compiled')
    print(f'{"bare op":>12}: {bare:8.1f} us per call')


if __name__ == '__main__':
    main()
