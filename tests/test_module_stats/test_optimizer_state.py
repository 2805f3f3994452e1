""":func:`float64_dots` (``mmstats/module_stats/optimizer_state.py``)
equals exact float64 dot products for float32, bfloat16 and float16
tensors, in chunks and pieces; ModuleStatsHook's use of it through a real
Runner: ``tests/test_module_stats/test_module_stats_optimizer_float64.py``."""
import numpy as np
import pytest
import torch

from mmstats.module_stats import optimizer_state
from mmstats.module_stats.optimizer_state import float64_dots


def _pairs(dtype, sizes=(5, 0, 12, 1, 40), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=gen).to(dtype),
             torch.randn(n, generator=gen).to(dtype)) for n in sizes]


def _exact(pairs):
    return np.array([(a.double() * b.double()).sum().item() for a, b in pairs])


@pytest.mark.parametrize('dtype',
                         [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize('chunk', [1 << 22, 7, 1])
def test_dots_are_float64_products(monkeypatch, dtype, chunk):
    """Chunks of 7 and 1 elements cut the tensors in pieces (added up per
    tensor); empty tensors give 0."""
    monkeypatch.setattr(optimizer_state, 'DOT_CHUNK', chunk)
    pairs = _pairs(dtype)
    got = float64_dots([a for a, _ in pairs], [b for _, b in pairs])
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), _exact(pairs), rtol=1e-15)
    assert got[1] == 0


def test_a_float32_product_that_rounds_is_exact():
    """(1 + 2^-12)^2 needs 25 bits: float32 rounds it (ties to even, a
    relative 6e-8 lost per element), float64 keeps it."""
    g = torch.full((1000, ), 1 + 2.**-12)
    exact = 1000 * (1 + 2.**-12)**2
    assert float(float64_dots([g], [g])[0]) == exact
    assert float((g * g).sum(dtype=torch.float64)) != exact  # the old way
