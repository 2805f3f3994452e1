"""report() / report0() inside torch.compile on 2 gloo ranks: report0
counts rank 0's values only, and the calls survive dead-code elimination
(the custom op is side-effectful) in a graph whose result is unused."""
import numpy as np
import torch

from tests.helpers.dist import run_distributed


def _compiled_ranks(rank, world_size):
    from mmstats.stats import Collector, report, report0
    torch._dynamo.reset()
    try:

        def step(x):
            y = x * 2
            report('both', y)  # every rank's values
            report0('first', y + 1)  # rank 0's values only
            return y.sum()

        compiled = torch.compile(step, backend='aot_eager', fullgraph=True)
        collector = Collector()
        for i in range(3):
            compiled(torch.full((4, ), float(10 * rank + i)))
        collector.update()
        return {
            name: (collector.num(name), collector.mean(name))
            for name in ('both', 'first')
        }
    finally:
        torch._dynamo.reset()


def test_compiled_report0_counts_rank_0_only():
    results = run_distributed(_compiled_ranks, 2, timeout=240)
    both = [2. * (10 * r + i) for r in range(2) for i in range(3)] * 4
    first = [2. * i + 1 for i in range(3)] * 4
    for got in results:
        assert got['both'][0] == len(both)
        assert got['both'][1] == np.mean(both)
        assert got['first'][0] == len(first)  # not rank 1's too
        assert got['first'][1] == np.mean(first)
