"""report() inside a torch.compile'd CUDA forward: no recompilation after
warm-up, no host-device sync, exact values."""
import numpy as np
import pytest
import torch
from torch import nn

from mmstats import Collector, report
from mmstats.stats import reset
from .common import assert_stats, requires_cuda, sync_debug_error

pytestmark = requires_cuda


class ReportingMLP(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        report('compiled/h_mean', h.mean())
        report('compiled/h', h)  # 16 x 64 = 1024 values per call
        return self.fc2(h)


@pytest.fixture
def no_recompile():
    import torch._dynamo as dynamo
    reset()
    dynamo.reset()
    saved = dynamo.config.error_on_recompile
    dynamo.config.error_on_recompile = True
    yield
    dynamo.config.error_on_recompile = saved
    dynamo.reset()
    reset()


def test_report_in_compiled_cuda_forward(no_recompile):
    torch.manual_seed(0)
    model = ReportingMLP().cuda()
    compiled = torch.compile(model)
    collector = Collector(regex='compiled/.*', keep_previous=False)
    inputs = [torch.randn(16, 32, device='cuda') for _ in range(6)]
    compiled(inputs[0])  # warm-up: compiles once
    collector.update()  # drop the warm-up values
    with sync_debug_error():
        outputs = [compiled(x) for x in inputs[1:]]
    collector.update()
    with torch.no_grad():
        hidden = [torch.relu(model.fc1(x)).double().cpu() for x in inputs[1:]]
    results = collector.as_dict()
    # float32 kernels may fuse differently from eager: rtol 1e-5
    assert_stats(
        results['compiled/h_mean'],
        np.array([h.mean().item() for h in hidden]),
        rtol=1e-5)
    assert_stats(
        results['compiled/h'],
        np.concatenate([h.numpy().ravel() for h in hidden]),
        rtol=1e-5)
    assert results['compiled/h']['num'] == 5 * 16 * 64
    for x, out in zip(inputs[1:], outputs):
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
