"""Compiled report(): tensors are reduced to their moments row inside the
graph (where inductor fuses the reduction with the code producing them),
only the row leaves it, and the result is the eager one within float64
rounding."""
import numpy as np
import pytest
import torch

from mmstats.stats import Collector, phase, report, reporting
# the autouse fixture: a clean reporter and dynamo, recompiles are errors
from tests.test_stats.test_report_compile import clean_state  # noqa: F401


class GraphRecorder:
    """A dynamo backend that keeps every graph it is given and runs it."""

    def __init__(self) -> None:
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm

    def calls(self, op_name: str) -> list:
        """The calls of ``torch.ops.mmstats.<op_name>`` in every graph."""
        op = getattr(torch.ops.mmstats, op_name)
        return [
            node for gm in self.graphs for node in gm.graph.nodes
            if node.op == 'call_function' and node.target in (op, op.default)
        ]


def _step(x):
    h = (x * 3).relu()
    report('h', h)
    report('h_mean', h.mean())
    return h.sum()


def test_only_the_row_leaves_the_graph():
    recorder = GraphRecorder()
    compiled = torch.compile(_step, backend=recorder, fullgraph=True)
    collector = Collector(keep_previous=False)
    x = torch.randn(5, 7)
    compiled(x)
    assert len(recorder.graphs) == 1
    rows = recorder.calls('report_row')
    assert len(rows) == 2 and not recorder.calls('report')
    for node in rows:
        row, values, name, rank0 = node.args
        assert values is None  # nothing sketches: the values stay inside
        assert tuple(row.meta['example_value'].shape) == (6, )
        assert row.meta['example_value'].dtype is torch.float64
    # the reduction is traced: its ops are graph nodes, not an op's kernel
    targets = {
        getattr(node.target, '__name__', str(node.target))
        for node in recorder.graphs[0].graph.nodes
    }
    assert {'amin', 'amax', 'sum'} <= targets
    collector.update()
    h = (x * 3).relu().double()
    assert collector.num('h') == h.numel()
    assert collector.mean('h') == pytest.approx(h.mean().item(), rel=1e-14)


def _values(kind: str) -> torch.Tensor:
    """Values that make a plain reduction inexact: a mean far from zero
    against the spread, non-finite values, low precision, integers."""
    gen = torch.Generator().manual_seed(0)
    if kind == 'offset':
        return 1e4 + torch.randn(300_000, generator=gen)
    if kind == 'outlier_first':  # a poor shift, were it the first value
        x = torch.randn(300_000, generator=gen)
        x[0] = 1e6
        return x
    if kind == 'outliers_first':  # the worst shift the bound allows
        x = torch.randn(300_000, generator=gen)
        x[:(x.numel() + 255) // 256] = 1e6
        return x
    x = torch.randn(64, 33, generator=gen)
    if kind == 'nonfinite':
        x[3, 4], x[10, 0], x[60,
                             32] = float('nan'), float('inf'), -float('inf')
        return x
    if kind == 'all_nonfinite':
        return torch.full((3, ), float('nan'))
    if kind == 'float16':
        return x.half() * 100
    if kind == 'bfloat16':
        return x.bfloat16()
    if kind == 'int':
        return (x * 1000).long()
    return x > 0  # bool


@pytest.mark.parametrize('kind', [
    'offset', 'outlier_first', 'outliers_first', 'nonfinite', 'all_nonfinite',
    'float16', 'bfloat16', 'int', 'bool'
])
def test_compiled_rows_equal_eager_and_numpy(kind):
    values = _values(kind)
    compiled = torch.compile(
        lambda x: report('compiled', x) + 0, backend='inductor')
    collector = Collector(keep_previous=False)
    compiled(values)
    compiled(values)  # two rows merged
    report('eager', values)
    report('eager', values)
    collector.update()
    raw = np.concatenate([values.double().numpy().ravel()] * 2)
    finite = raw[np.isfinite(raw)]
    assert collector.nonfinite('compiled') == raw.size - finite.size
    assert collector.num('compiled') == finite.size
    for stat in ('num', 'nonfinite', 'min', 'max'):
        got, eager = (
            getattr(collector, stat)(name) for name in ('compiled', 'eager'))
        assert got == eager or np.isnan(got) and np.isnan(eager)
    if not finite.size:
        return
    assert collector.min('compiled') == finite.min()
    assert collector.max('compiled') == finite.max()
    for stat, ref in (('mean', finite.mean()), ('std', finite.std())):
        got = getattr(collector, stat)('compiled')
        assert got == pytest.approx(ref, rel=1e-12, abs=1e-300)
        assert got == pytest.approx(
            getattr(collector, stat)('eager'), rel=1e-12, abs=1e-300)


def test_many_reports_in_one_graph_keep_their_own_rows():
    # inductor reuses a row's buffer once the op returned: the kernel
    # copies it, or every name would hold the last row computed
    def step(x):
        for i in range(4):
            report(f'v{i}', x + i)
        return x

    compiled = torch.compile(step, backend='inductor')
    collector = Collector(keep_previous=False)
    compiled(torch.arange(6.))
    collector.update()
    assert [collector.mean(f'v{i}') for i in range(4)] == [2.5, 3.5, 4.5, 5.5]


def test_phase_suspension_and_sketches_at_run_time():
    compiled = torch.compile(lambda x: report('v', x * 2) + 1)
    x = torch.arange(1., 101.)
    compiled(x)  # no collector: nothing kept
    collector = Collector(keep_previous=False)
    with reporting.suspend_reporting():
        compiled(x)
    previous = phase('val')
    compiled(x)
    phase(previous)
    collector.update()  # none of these recompiled
    assert collector.names() == ['val/v']
    assert collector.mean('val/v') == 101.
    # a collector that sketches needs the values: one recompile, then the
    # compiled quantiles are the eager ones
    torch._dynamo.config.error_on_recompile = False
    sketching = Collector(keep_previous=False, sketch=True)
    compiled(x)
    report('eager', x * 2)
    sketching.update()
    for q in (0.1, 0.5, 0.9):
        assert sketching.quantile('v', q) == sketching.quantile('eager', q)
