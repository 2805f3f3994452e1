# Copyright (c) mmstats contributors. All rights reserved.
"""The moment kernels against float64 numpy recomputations."""
import numpy as np
import pytest
import torch

from mmstats.stats.moments import (M2, MAX, MEAN, MIN, NONFINITE, N,
                                   merge_rows, reduce_groups, reduce_tensor,
                                   reduce_values)
from tests.helpers.torch_versions import HALF_AMINMAX

# Sizes around the old chunk size of the CPU reduction.
LARGE_CHUNK_NUMEL = 131072
#: float16, whose ATen op counts assume torch's CPU float16 aminmax
HALF = pytest.param(torch.float16, marks=HALF_AMINMAX)


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
@pytest.mark.parametrize('sync_free', [False, True])
def test_reduce_tensor_matches_numpy(numel, dtype, sync_free):
    gen = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=gen, dtype=torch.float64) * 3 +
         1e4).to(dtype)
    if numel > 10:  # non-finite values in several chunks
        x[[3, numel // 2, numel - 1
           ]] = torch.tensor([float('nan'),
                              float('inf'), -float('inf')],
                             dtype=dtype)
    row = reduce_tensor(x.reshape(-1, 1) if numel % 2 else x, sync_free)
    row = merge_rows(row[None], torch.zeros(1, dtype=torch.long), 1)[0]
    assert row.shape == (6, ) and row.dtype == torch.float64
    assert_row(row, x.double().numpy())


def test_reduce_tensor_empty():
    assert_row(reduce_tensor(torch.zeros(0, 3)), np.zeros(0))


@pytest.mark.parametrize('sync_free', [False, True])
def test_reduce_tensor_all_nonfinite(sync_free):
    x = torch.full((2 * LARGE_CHUNK_NUMEL + 3, ), float('nan'))
    seg = torch.zeros(1, dtype=torch.long)
    x[5] = 2.5
    row = merge_rows(reduce_tensor(x, sync_free)[None], seg, 1)[0]
    assert_row(row, x.double().numpy())
    x[5] = float('inf')
    row = merge_rows(reduce_tensor(x, sync_free)[None], seg, 1)[0]
    assert_row(row, x.double().numpy())


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
@pytest.mark.parametrize('sync_free', [False, True])
def test_reduce_tensor_other_dtypes(dtype, sync_free):
    x = (torch.arange(2 * LARGE_CHUNK_NUMEL + 5) % 7).to(dtype)
    assert_row(reduce_tensor(x, sync_free), x.double().numpy())


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('sync_free', [False, True])
def test_reduce_tensor_leaves_its_input_alone(dtype, sync_free):
    x = torch.randn(3 * LARGE_CHUNK_NUMEL, dtype=dtype) + 5
    x[7] = float('nan')  # the masked path too
    before = x.clone()
    reduce_tensor(x, sync_free)
    reduce_tensor(x[8:], sync_free)
    torch.testing.assert_close(x, before, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize('dtype', [torch.float32, HALF])
def test_report_issues_no_more_aten_ops_than_stylegan3(dtype):
    """Host work per report() call, counted (device-independent): never
    more ATen operations than StyleGAN3's training_stats.report, and a
    fixed number at every size (no per-chunk or per-element loop)."""
    from mmstats.stats import Collector, report, reporting
    from tools.benchmarks.stylegan3_ref import count_aten_ops, stylegan3_report
    reporting.reset()
    collector = Collector()  # noqa: F841 (reports are kept while alive)
    large = []
    for numel in (0, 1024, 65536, 1048576):
        x = torch.randn(numel if numel else ()).to(dtype) + 3
        report('x', x)  # steady state: the name is known to both
        stylegan3_report('x', x)
        ours = count_aten_ops(lambda: report('x', x))
        theirs = count_aten_ops(lambda: stylegan3_report('x', x))
        assert len(ours) <= len(theirs), (numel, ours, theirs)
        if numel > 4096:
            large.append(len(ours))
            device_path = count_aten_ops(lambda: reduce_tensor(x, True))
            assert len(device_path) == 11, device_path
    # float32: aminmax, float64 copy, sum, square_, sum, row; float16: +1
    assert large[0] == large[1] == (7 if dtype is torch.float16 else 6)
    reporting.reset()


def _far_from_zero(numel, dtype):  # one sign, within a factor of two
    return torch.randn(numel).to(dtype) + (1e6
                                           if dtype is torch.float32 else 1e3)


def _outlier_at_zero(numel, dtype):  # the sum of squares is refined
    x = _far_from_zero(numel, dtype)
    x[numel // 3] = 0.
    return x


def _near_constant(numel, dtype):  # mean / std ~1e10: mean corrected
    x = torch.full((numel, ), 1.5, dtype=dtype)
    x[7] = 1.5 + torch.finfo(dtype).eps  # the next number after 1.5
    return x


def _with_nan_and_inf(numel, dtype):  # the masked path
    x = torch.randn(numel).to(dtype) + 3
    x[[5,
       numel // 2]] = torch.tensor([float('nan'), float('inf')], dtype=dtype)
    return x


@pytest.mark.parametrize('make', [
    lambda n, dtype: torch.randn(n).to(dtype) + 3, _far_from_zero,
    _outlier_at_zero, _near_constant
])
@pytest.mark.parametrize('numel', [65536, 1048576])
@pytest.mark.parametrize('dtype', [torch.float32, HALF])
def test_large_report_issues_no_more_aten_ops_than_stylegan3(
        make, numel, dtype):
    """report() of 64 k / 1 M float32 / float16 values, on every branch of
    the CPU reduction of finite values: never more ATen operations than
    StyleGAN3's report, except one more on the rare outlier branch (its
    exact two-pass copies the values again: a BLAS dot instead would be
    one op less, and up to 4e-12 off with one thread)."""
    from mmstats.stats import Collector, report, reporting
    from tools.benchmarks.stylegan3_ref import count_aten_ops, stylegan3_report
    reporting.reset()
    collector = Collector()  # noqa: F841 (reports are kept while alive)
    x = make(numel, dtype)
    report('x', x)
    stylegan3_report('x', x)
    ours = count_aten_ops(lambda: report('x', x))
    theirs = count_aten_ops(lambda: stylegan3_report('x', x))
    allowed = len(theirs) + (make is _outlier_at_zero)
    assert 6 <= len(ours) <= allowed, (ours, theirs)
    reporting.reset()


@pytest.mark.parametrize('make', [
    lambda n, dtype: torch.randn(n).to(dtype) + 3,
    lambda n, dtype: torch.randn(n).to(dtype),
    lambda n, dtype: torch.randn(n).to(dtype).clamp(min=0),
    lambda n, dtype: torch.rand(n).to(dtype) + 1,
    lambda n, dtype: torch.rand(n).to(dtype) * 3 + 1, lambda n, dtype: torch.
    randn(n).to(dtype) * 10.**torch.randint(-4, 5, (n, )).to(dtype),
    _far_from_zero, _outlier_at_zero, _near_constant, _with_nan_and_inf
])
@pytest.mark.parametrize('dtype',
                         [torch.float32, torch.float16, torch.bfloat16])
def test_large_tensor_moments_are_exact(make, dtype):
    """The CPU reduction of a large tensor against numpy's float64 mean
    and two-pass M2 on every branch (sum of squares, its refinement, the
    centered two-pass, the mean's correction, the masked path): mean
    1e6 / std 1, values around zero, a ReLU's, mixed magnitudes, NaN /
    inf."""
    torch.manual_seed(0)
    x = make(1048576, dtype)
    row = reduce_tensor(x)
    assert row.dtype == torch.float64
    assert_row(row, x.double().numpy())


@pytest.mark.parametrize('bad', [float('inf'), -float('inf')])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('sync_free', [False, True])
def test_reduce_tensor_with_inf_and_no_nan(bad, dtype, sync_free):
    """An infinity without a NaN (aminmax is then finite at one end, not
    NaN): the large-tensor path must still leave it out of n, mean, std,
    min and max and count it as non-finite."""
    x = torch.arange(5000, dtype=dtype) / 100  # > LARGE_NUMEL (4096)
    x[1234] = bad
    row = reduce_tensor(x, sync_free)
    row = merge_rows(row[None], torch.zeros(1, dtype=torch.long), 1)[0]
    assert row[N] == 4999 and row[NONFINITE] == 1
    assert_row(row, x.double().numpy())


def test_large_tensors_reduced_in_threads_at_once():
    """The CPU reduction's float64 scratch copies are per thread: tensors
    of one size reduced in several threads at once keep their own rows."""
    import threading
    xs = [torch.randn(65536) * (i + 1) + i for i in range(4)]
    rows = [[] for _ in xs]
    start = threading.Barrier(len(xs))

    def work(i):
        start.wait()
        for _ in range(20):
            rows[i].append(reduce_tensor(xs[i]))

    threads = [threading.Thread(target=work, args=(i, )) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for x, got in zip(xs, rows):
        assert len(got) == 20
        for row in got:
            assert_row(row, x.double().numpy())
