"""The pure functions of :mod:`mmstats.sharding` without a runner (the
sharded runs themselves: ``test_sharded.py``): :func:`sum_squares`, the
per-module float64 sums of squares every norm of ModuleStatsHook is made
of."""
import numpy as np
import pytest
import torch

from mmstats.sharding import sum_squares


def test_sum_squares_of_changing_layouts():
    """LayerDrop/MoE: the set of parameters with a gradient changes every
    iteration; every layout gives its exact sums."""
    tensors = [torch.full((2, ), float(i)) for i in range(6)]
    for step in range(50):
        keep = [i for i in range(6) if (step >> (i % 5)) & 1 or i == 5]
        result = sum_squares([tensors[i] for i in keep], [i % 3 for i in keep],
                             3, torch.device('cpu'))
        expected = [
            sum(2 * float(i)**2 for i in keep if i % 3 == s) for s in range(3)
        ]
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12)


def test_norms_of_huge_gradients_are_finite():
    """float64 accumulation: elements near float32's limit (a gradient
    still multiplied by a loss scale of 2**127) give a finite norm."""
    big = torch.full((1000, ), 2.**127)
    result = sum_squares([big, big], [0, 0], 1, big.device).sqrt()
    assert torch.isfinite(result).all()
    assert result.item() == pytest.approx(2.**127 * np.sqrt(2000), rel=1e-12)
