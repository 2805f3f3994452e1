# Copyright (c) mmstats contributors. All rights reserved.
"""The moment kernels against float64 numpy recomputations."""
import numpy as np
import pytest
import torch

from mmstats.stats.moments import (LARGE_CHUNK_NUMEL, M2, MAX, MEAN, MIN,
                                   NONFINITE, N, reduce_groups, reduce_tensor,
                                   reduce_values)


def expected_row(values: np.ndarray) -> np.ndarray:
    """The row in column order, from numpy."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return np.array([0., 0., 0., np.inf, -np.inf, values.size])
    mean = finite.mean()
    return np.array([
        finite.size, mean, ((finite - mean)**2).sum(),
        finite.min(),
        finite.max(), values.size - finite.size
    ])


def assert_row(row: torch.Tensor, values: np.ndarray) -> None:
    want = expected_row(values)
    got = row.cpu().numpy()
    exact = [N, NONFINITE, MIN, MAX]  # counts and extremes: to the bit
    assert got[exact].tolist() == want[exact].tolist()
    np.testing.assert_allclose(got[[MEAN, M2]], want[[MEAN, M2]], rtol=1e-12)


@pytest.mark.parametrize('numel', [
    1, 4097, LARGE_CHUNK_NUMEL, LARGE_CHUNK_NUMEL + 1,
    4 * LARGE_CHUNK_NUMEL + 7
])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_reduce_tensor_matches_numpy(numel, dtype):
    gen = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=gen, dtype=torch.float64) * 3 +
         1e4).to(dtype)
    if numel > 10:  # non-finite values in several chunks
        x[[3, numel // 2, numel - 1
           ]] = torch.tensor([float('nan'),
                              float('inf'), -float('inf')],
                             dtype=dtype)
    row = reduce_tensor(x.reshape(-1, 1) if numel % 2 else x)
    assert row.shape == (6, ) and row.dtype == torch.float64
    assert_row(row, x.double().numpy())


def test_reduce_tensor_empty():
    assert_row(reduce_tensor(torch.zeros(0, 3)), np.zeros(0))


def test_reduce_tensor_all_nonfinite_chunks():
    x = torch.full((2 * LARGE_CHUNK_NUMEL + 3, ), float('nan'))
    x[5] = 2.5
    assert_row(reduce_tensor(x), x.double().numpy())
    x[5] = float('inf')
    assert_row(reduce_tensor(x), x.double().numpy())


def test_reduce_values_is_stable_far_from_zero():
    x = torch.tensor([1e9 + 1, 1e9 + 2, 1e9 + 3], dtype=torch.float64)
    row = reduce_values(x)[0]
    assert row[MEAN].item() == 1e9 + 2 and row[M2].item() == 2.0


def test_reduce_groups_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(5., 2., 1000)
    x[[10, 500]] = [np.nan, np.inf]
    seg = rng.integers(0, 4, 1000)
    rows = reduce_groups(x, seg, 5)
    for group in range(4):
        assert_row(torch.from_numpy(rows[group]), x[seg == group])
    assert_row(torch.from_numpy(rows[4]), x[:0])


@pytest.mark.parametrize('dtype', [torch.int64, torch.bool, torch.float16])
def test_reduce_tensor_other_dtypes(dtype):
    x = (torch.arange(2 * LARGE_CHUNK_NUMEL + 5) % 7).to(dtype)
    assert_row(reduce_tensor(x), x.double().numpy())


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_reduce_tensor_leaves_its_input_alone(dtype):
    x = torch.randn(3 * LARGE_CHUNK_NUMEL, dtype=dtype) + 5
    before = x.clone()
    reduce_tensor(x)
    assert torch.equal(x, before)
