"""Shared pieces of the CUDA tests: the skip marker, a small BN model and
float64 references.

Every test module here sets ``pytestmark = requires_cuda``, so on a machine
without CUDA (CI) the whole folder is collected and reported as skipped.
"""
import contextlib
from typing import Dict, Iterator, List

import numpy as np
import pytest
import torch
from torch import nn

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs a CUDA device')


@contextlib.contextmanager
def sync_debug_error() -> Iterator[None]:
    """Every synchronising CUDA call inside the block raises."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode('error')
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def numpy_stats(values: np.ndarray) -> Dict[str, float]:
    """The statistics a Collector publishes, in float64 numpy (``num`` and
    the moments count finite values; ``nonfinite`` the others)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    return dict(
        num=float(finite.size),
        mean=float(finite.mean()),
        std=float(finite.std()),
        min=float(finite.min()),
        max=float(finite.max()),
        nonfinite=float(values.size - finite.size))


def assert_stats(published: Dict[str, float],
                 values: np.ndarray,
                 rtol: float = 1e-12) -> None:
    """``published`` (one name of ``Collector.as_dict()``) against numpy."""
    expected = numpy_stats(values)
    for stat, value in expected.items():
        np.testing.assert_allclose(
            published[stat],
            value,
            rtol=rtol,
            atol=rtol * abs(expected['std']),
            err_msg=stat)


class SmallBNNet(nn.Module):
    """Conv-BN-ReLU twice, pooled, a linear head and a BatchNorm1d."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(
            channels, 2 * channels, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.fc = nn.Linear(2 * channels, 10)
        self.bn3 = nn.BatchNorm1d(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.bn3(self.fc(x.mean(dim=(2, 3))))


def bn_layers(model: nn.Module) -> Dict[str, nn.Module]:
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    }


@torch.no_grad()
def population_stats(model: nn.Module,
                     batches: List[torch.Tensor],
                     context=contextlib.nullcontext) -> Dict[str, tuple]:
    """Float64 population mean and biased variance of every BN layer's
    input over ``batches``, with the layers normalising by batch
    statistics (training mode) as in a precise-BN pass.

    ``model`` is run as given (pass a float64 copy for a float64
    reference, or the model itself under ``context`` to get the exact
    statistics of the values an AMP forward feeds the layers); its
    buffers are restored afterwards.
    """
    layers = bn_layers(model)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    sums: Dict[str, list] = {name: [] for name in layers}
    handles = []
    for name, layer in layers.items():

        def hook(module, inputs, name=name):
            x = inputs[0].double()
            dims = [d for d in range(x.dim()) if d != 1]
            sums[name].append((x.shape.numel() // x.shape[1], x.sum(dims),
                               (x * x).sum(dims)))

        handles.append(layer.register_forward_pre_hook(hook))
    was_training = model.training
    model.train()
    try:
        for batch in batches:
            with context():
                model(batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
        model.load_state_dict(saved)
    result = {}
    for name, parts in sums.items():
        count = sum(n for n, _, _ in parts)
        mean = sum(s for _, s, _ in parts) / count
        # Two passes would be more stable; the inputs here are O(1).
        var = sum(q for _, _, q in parts) / count - mean * mean
        result[name] = (mean.cpu(), var.cpu())
    return result
