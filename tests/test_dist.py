"""scaled_all_reduce: exact averages in place, one collective per dtype."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

from mmstats.dist import get_rank, get_world_size, scaled_all_reduce
from tests.helpers.dist import run_distributed

SHAPES = [(3, ), (2, 5), (), (4, 1, 3), (7, )]
DTYPES = [
    torch.float32, torch.float64, torch.float32, torch.float16, torch.float64
]


def _make(rank: int):
    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for shape, dtype in zip(SHAPES, DTYPES):
        out.append((torch.randn(shape, generator=gen, dtype=torch.float64) *
                    (rank + 1) + rank).to(dtype))
    # a non-contiguous tensor (a transposed view of a bigger one)
    out.append(torch.randn(5, 3, generator=gen).t())
    return out


def _worker_reduce(rank, world_size):
    tensors = _make(rank)
    ids = [id(t) for t in tensors]
    ptrs = [t.data_ptr() for t in tensors]
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append((tensor.dtype, tensor.numel()))
        return real(tensor, *args, **kwargs)

    # one dtype, 1-D only (the BN-buffer case), one of them strided
    base = torch.arange(10.) * (rank + 1)
    same_dtype = [torch.full((3, ), rank + 1.), base[::2], torch.ones(4)]
    dist.all_reduce = counting
    try:
        out = scaled_all_reduce(tensors)
        n_calls = len(calls)
        scaled_all_reduce(same_dtype)
    finally:
        dist.all_reduce = real
    return dict(
        same_dtype=[t.tolist() for t in same_dtype],
        base=base.tolist(),
        same_dtype_calls=len(calls) - n_calls,
        out=[t.numpy().copy() for t in out],  # no shared memory
        same_objects=[id(t) for t in out] == ids,
        same_storage=[t.data_ptr() for t in tensors] == ptrs,
        calls=calls[:n_calls],
        world=get_world_size(),
        rank=get_rank())


@pytest.mark.parametrize('world_size', [2, 4])
def test_scaled_all_reduce_exact_in_place(world_size):
    results = run_distributed(_worker_reduce, world_size)
    inputs = [_make(rank) for rank in range(world_size)]
    for rank, res in enumerate(results):
        assert res['rank'] == rank and res['world'] == world_size
        assert res['same_objects'] and res['same_storage']
        # one collective per (device, dtype) bucket: float16, 32, 64
        assert len(res['calls']) == 3
        assert sorted(str(d) for d, _ in res['calls']) == [
            'torch.float16', 'torch.float32', 'torch.float64'
        ]
        for i, got in enumerate(res['out']):
            got = torch.from_numpy(got)
            ref = sum(inp[i].double() for inp in inputs) / world_size
            assert got.dtype == inputs[0][i].dtype
            assert got.shape == inputs[0][i].shape
            if got.dtype == torch.float16:
                torch.testing.assert_close(
                    got.double(), ref, rtol=2e-3, atol=2e-3)
            else:
                tol = 1e-6 if got.dtype == torch.float32 else 1e-13
                torch.testing.assert_close(
                    got.double(), ref, rtol=tol, atol=tol)
        # bitwise identical on every rank
        for a, b in zip(res['out'], results[0]['out']):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        # one dtype and device: a single collective, strided view in place
        avg = (world_size + 1) / 2
        assert res['same_dtype_calls'] == 1
        assert res['same_dtype'][0] == [avg] * 3
        assert res['same_dtype'][1] == [2. * i * avg for i in range(5)]
        assert res['base'][::2] == res['same_dtype'][1]
        assert res['base'][1::2] == [(2. * i + 1) * (rank + 1)
                                     for i in range(5)]
        assert res['same_dtype'][2] == [1.] * 4


def _worker_int(rank, world_size):
    try:
        scaled_all_reduce([torch.ones(2), torch.ones(2, dtype=torch.long)])
    except TypeError as exc:
        return str(exc)
    return None


def test_integer_tensor_raises_in_group():
    msgs = run_distributed(_worker_int, 2)
    for msg in msgs:
        assert msg is not None and 'tensors[1]' in msg
        assert 'torch.int64' in msg and 'floating dtype' in msg


def test_noop_without_process_group():
    assert not dist.is_initialized()
    a = torch.tensor([1.0, 2.0])
    b = torch.zeros(2, 2, dtype=torch.float64)
    out = scaled_all_reduce([a, b])
    assert out[0] is a and out[1] is b
    assert torch.equal(a, torch.tensor([1.0, 2.0]))
    assert scaled_all_reduce([]) == []
    assert get_world_size() == 1 and get_rank() == 0


@pytest.mark.parametrize('dtype',
                         [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_non_floating_raises(dtype):
    with pytest.raises(TypeError, match=r'tensors\[0\].*floating dtype'):
        scaled_all_reduce([torch.zeros(3, dtype=dtype)])
    with pytest.raises(TypeError, match='not a torch.Tensor'):
        scaled_all_reduce([1.0])
