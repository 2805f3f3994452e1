"""report() on CUDA: 0-d/1-d/>4096-element/fp16/bf16 tensors and report0
without a host-device sync (also from a thread and through the compiled
path's custom op), exact after update()."""
import threading

import numpy as np
import pytest
import torch

from mmstats.stats import Collector, report, report0, reporting
from .common import requires_cuda, sync_debug_error

pytestmark = requires_cuda

SHAPES = {
    'c/0d': ((), torch.float32),
    'c/1d': ((257, ), torch.float32),
    'c/large': ((5000, ), torch.float32),
    'c/fp16': ((300, ), torch.float16),
    'c/bf16_large': ((8192, ), torch.bfloat16),
}


@pytest.fixture(autouse=True)
def clean_state():
    reporting.REPORTER._collectors.clear()
    reporting.reset()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    reporting.REPORTER._collectors.clear()
    reporting.reset()


def _values():
    gen = torch.Generator().manual_seed(0)
    return {
        name: (torch.randn(shape, generator=gen, dtype=torch.float64) * 2 +
               1).to(dtype).cuda()
        for name, (shape, dtype) in SHAPES.items()
    }


def _check(collector, refs):
    for name, ref in refs.items():
        ref = np.concatenate([r.double().cpu().numpy().ravel() for r in ref])
        assert collector.num(name) == ref.size
        assert collector.mean(name) == pytest.approx(ref.mean(), rel=1e-9)
        assert collector.std(name) == pytest.approx(ref.std(), rel=1e-9)


def test_report_and_report0_cuda_no_sync():
    collector = Collector(keep_previous=False)
    values = _values()
    with sync_debug_error():
        for name, value in values.items():
            report(name, value)
            report0(name + '0', value)
        t = threading.Thread(
            target=lambda: [report(n, v) for n, v in values.items()])
        t.start()
        t.join()
    collector.update()
    refs = {name: [v, v] for name, v in values.items()}
    refs.update({name + '0': [v] for name, v in values.items()})
    _check(collector, refs)


def test_compiled_cuda_forward_no_recompile_no_sync():
    net = torch.nn.Linear(16, 8).cuda()

    def forward(x):
        y = net(x)
        report('c/y', y)
        report('c/y_half', y.half())
        report('c/y_mean', y.mean())
        return y

    compiled = torch.compile(forward)
    collector = Collector(keep_previous=False)
    xs = [torch.randn(4, 16, device='cuda') for _ in range(4)]
    compiled(xs[0])  # compile
    collector.update()
    torch._dynamo.config.error_on_recompile = True
    try:
        with sync_debug_error():
            for x in xs:
                compiled(x)
    finally:
        torch._dynamo.config.error_on_recompile = False
    collector.update()
    with torch.no_grad():
        ys = [net(x) for x in xs]
    _check(collector, {'c/y': ys, 'c/y_mean': [y.mean() for y in ys]})
    assert collector.num('c/y_half') == 4 * 4 * 8
