"""BNRecorder through update_bn_stats: runs of equal batches, batches too
small for BatchNorm, and the recording pause."""
import copy

import pytest
import torch
from torch import nn

from mmstats import Collector, report, update_bn_stats
from mmstats.stats import reporting
from tests.helpers.logs import mmengine_logs, warnings_logged


def _population(model, batches):
    """float64 population statistics of the BN input (Linear first)."""
    x = torch.cat(batches).double()
    h = x @ model[0].weight.double().t() + model[0].bias.double()
    return h.mean(0), h.var(0, unbiased=False)


@pytest.mark.parametrize('sizes', [[8, 8, 8, 3, 8, 8], [3, 8, 8], [8] * 5])
def test_runs_of_equal_batches_are_exact(sizes):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(n, 4, generator=gen) * 2 + 5 for n in sizes]
    summary = update_bn_stats(model, batches, sum(sizes), progress=False)
    assert summary['num_batches'] == len(sizes)
    mean, var = _population(model, batches)
    torch.testing.assert_close(
        model[1].running_mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        model[1].running_var.double(), var, rtol=1e-5, atol=1e-6)


def test_a_one_sample_batch_is_skipped_not_fatal(caplog):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(n, 4, generator=gen) for n in (8, 8, 1)]
    with mmengine_logs(caplog):
        summary = update_bn_stats(model, batches, 100, progress=False)
    logged = warnings_logged(caplog)
    assert len(logged) == 2, logged  # the skipped batch, then the short run
    assert 'skipped a batch too small for BatchNorm' in logged[0]
    assert 'ran out after 16 samples (2 batches)' in logged[1]
    assert (summary['num_batches'], summary['num_samples']) == (2, 16)
    mean, var = _population(model, batches[:2])
    torch.testing.assert_close(
        model[1].running_var.double(), var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        model[1].running_mean.double(), mean, rtol=1e-5, atol=1e-6)


class _Reporting(nn.Module):

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        report('act', x)
        return self.bn(x)


def test_reports_inside_the_recomputation_reach_no_collector():
    reporting.reset()
    collector = Collector()
    model = _Reporting()
    model(torch.ones(2, 3))  # a training forward: counted
    update_bn_stats(model, [torch.randn(4, 3)] * 3, 12, progress=False)
    collector.update()
    assert collector.num('act') == 6


class _Conv2dThen1d(nn.Module):
    """A BN2d that accepts one sample (its spatial positions count), then
    a BN1d that refuses it: the one-sample forward fails half-way."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn2d = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 4)
        self.bn1d = nn.BatchNorm1d(4)

    def forward(self, x):
        x = self.bn2d(self.conv(x)).mean((2, 3))
        return self.bn1d(self.fc(x))


@pytest.mark.parametrize('estimator', ['population', 'batch_average'])
def test_a_skipped_batch_in_the_middle_leaves_no_trace(estimator):
    """The one-sample batch comes between two full ones and fails in the
    BN1d after the BN2d has seen it: nothing of it (the BN2d's count and
    statistics of that forward) may leak into the next batch. The result
    is exactly the recomputation without it."""
    torch.manual_seed(0)
    model = _Conv2dThen1d()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    batches = [
        torch.randn(n, 2, 5, 5, generator=gen) * 2 + 1 for n in (6, 1, 6)
    ]
    summary = update_bn_stats(
        model,
        batches,
        100,
        estimator=estimator,
        progress=False,
        logger='silent')
    assert (summary['num_batches'], summary['num_samples']) == (2, 12)
    update_bn_stats(
        reference, [batches[0], batches[2]],
        100,
        estimator=estimator,
        progress=False,
        logger='silent')
    for name in ('bn2d', 'bn1d'):
        for buf in ('running_mean', 'running_var'):
            torch.testing.assert_close(
                getattr(getattr(model, name), buf),
                getattr(getattr(reference, name), buf),
                rtol=1e-6,
                atol=1e-7,
                msg=f'{name}.{buf}')
