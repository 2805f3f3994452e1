"""report() / report0() / Collector on CUDA tensors: no host-device sync
while reporting, exact statistics after update(), on 1 and 2 processes."""
import numpy as np
import pytest
import torch

from mmstats import Collector, report, report0
from mmstats.stats import reset
from tests.helpers.dist import run_distributed
from .common import assert_stats, requires_cuda, sync_debug_error

pytestmark = requires_cuda

# name -> (shape, dtype): 0-d, 1-d, above the pre-reduction size (4096),
# half precision small and large.
CASES = {
    'cuda/scalar': ((), torch.float32),
    'cuda/vector': ((300, ), torch.float32),
    'cuda/large': ((64, 129), torch.float32),
    'cuda/fp16': ((1000, ), torch.float16),
    'cuda/fp16_large': ((5000, ), torch.float16),
    'cuda/bf16': ((17, ), torch.bfloat16),
    'cuda/bf16_large': ((8192, ), torch.bfloat16),
    'cuda/fp64': ((33, ), torch.float64),
}
REPEATS = 3


@pytest.fixture(autouse=True)
def _clean_store():
    reset()
    yield
    reset()


def _values(seed: int, device: str = 'cuda') -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 +
               1).to(dtype).to(device)
        for name, (shape, dtype) in CASES.items()
    }


def test_report_cuda_tensors_no_sync_exact():
    collector = Collector(regex='cuda/.*')
    batches = [_values(seed) for seed in range(REPEATS)]
    with sync_debug_error():
        for values in batches:
            for name, value in values.items():
                assert report(name, value) is value
            report0('cuda/rank0', values['cuda/vector'])
    collector.update()
    results = collector.as_dict()
    for name in CASES:
        raw = np.concatenate(
            [b[name].double().cpu().numpy().ravel() for b in batches])
        assert_stats(results[name], raw)
    assert_stats(
        results['cuda/rank0'],
        np.concatenate([b['cuda/vector'].cpu().numpy() for b in batches]))


def test_report_nonfinite_cuda_counted_without_sync():
    collector = Collector(regex='nan/.*')
    value = torch.tensor([1.0, float('nan'),
                          float('inf'), -2.0],
                         device='cuda')
    big = torch.ones(5000, device='cuda')
    big[7] = float('-inf')
    with sync_debug_error():
        report('nan/small', value)
        report('nan/large', big)
    collector.update()
    results = collector.as_dict()
    assert_stats(results['nan/small'], value.cpu().numpy())
    assert_stats(results['nan/large'], big.cpu().numpy())


def test_collector_mixes_cuda_cpu_and_python_values():
    collector = Collector(keep_previous=False)
    cuda = torch.linspace(-1, 2, 50, device='cuda')
    cpu = torch.arange(7, dtype=torch.float32)
    big_cuda = torch.randn(6000, device='cuda', dtype=torch.float64)
    report('mixed', cuda)
    report('mixed', cpu)
    report('mixed', 2.5)
    report('mixed', [1, 2, 3])
    report('mixed', big_cuda)
    report('mixed', torch.tensor(4.0, device='cuda'))
    collector.update()
    raw = np.concatenate([
        cuda.cpu().numpy(),
        cpu.numpy(), [2.5, 1, 2, 3],
        big_cuda.cpu().numpy(), [4.0]
    ])
    assert_stats(collector.as_dict()['mixed'], raw)
    collector.update()  # nothing new: num 0
    assert collector.num('mixed') == 0


def _two_ranks(rank, world_size):
    torch.cuda.set_device(0)  # both ranks share the one GPU
    reset()
    collector = Collector(regex='r/.*')
    values = _values(seed=10 + rank)
    only0 = torch.tensor(5.0 + rank, device='cuda')  # a copy: outside
    ones = torch.ones(2, device='cuda')
    with sync_debug_error():
        for name, value in values.items():
            report('r/' + name, value)
        report('r/cpu', torch.full((3, ), float(rank)))
        report('r/mixed', value.float())  # the last case, on CUDA
        report('r/mixed', torch.arange(4.0) + rank)  # CPU
        report0('r/only0', only0)
        if rank == 1:  # a name only one rank reports
            report('r/rank1', ones)
    collector.update()
    return collector.as_dict()


def test_collector_two_gloo_ranks_sharing_the_gpu():
    results = run_distributed(_two_ranks, 2, timeout=180)
    assert results[0] == results[1]  # bit-identical on every rank
    res = results[0]
    per_rank = [_values(seed=10 + r, device='cpu') for r in range(2)]
    for name in CASES:
        raw = np.concatenate(
            [v[name].double().numpy().ravel() for v in per_rank])
        assert_stats(res['r/' + name], raw)
    assert_stats(res['r/cpu'], np.array([0.0] * 3 + [1.0] * 3))
    last = list(CASES)[-1]
    assert_stats(
        res['r/mixed'],
        np.concatenate([
            per_rank[0][last].float().double().numpy(),
            np.arange(4.0), per_rank[1][last].float().double().numpy(),
            np.arange(4.0) + 1
        ]))
    assert_stats(res['r/only0'], np.array([5.0]))
    assert_stats(res['r/rank1'], np.ones(2))
