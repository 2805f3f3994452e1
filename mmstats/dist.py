# Copyright (c) mmstats contributors. All rights reserved.
"""The cross-rank helpers: scaled_all_reduce (the coalesced, in-place
average), sum_all_reduce, host_group and slowest_rank.

Rank, world size and "is distributed" come from :mod:`mmengine.dist`
(re-exported here for convenience): they work with and without a process
group.
"""
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from mmengine.dist import (all_reduce, get_comm_device, get_rank,
                           get_world_size, is_distributed)
from torch import Tensor
from torch._utils import _flatten_dense_tensors

__all__ = [
    'is_distributed', 'get_world_size', 'get_rank', 'scaled_all_reduce',
    'sum_all_reduce', 'host_group', 'slowest_rank'
]


def _check_floating(tensors: Sequence[Tensor]) -> None:
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, Tensor):
            raise TypeError(f'scaled_all_reduce: tensors[{i}] is a '
                            f'{type(tensor).__name__}, not a torch.Tensor')
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise TypeError(
                f'scaled_all_reduce: tensors[{i}] has dtype {tensor.dtype}; '
                'averaging would truncate integers/bools: cast it to a '
                'floating dtype first (e.g. tensor.double())')


@torch.no_grad()
def scaled_all_reduce(tensors: Sequence[Tensor],
                      group: Optional[object] = None) -> List[Tensor]:
    """Average tensors in place over the processes of ``group``.

    The tensors are bucketed by (device, dtype); each bucket is flattened
    into one buffer, summed with a single ``all_reduce``, divided by the
    world size and copied back into the original tensors, so the result
    lives in the very tensor objects passed in (views and references held
    elsewhere stay valid). Buckets are reduced in a deterministic order
    (sorted by ``str(device)``, ``str(dtype)``), so all ranks issue the same
    collectives as long as they pass tensors of the same devices and dtypes.
    Only ``all_reduce(SUM)`` is used: works with gloo (CPU) and NCCL (CUDA).

    Without an initialised process group, or with a world size of 1, the
    tensors are returned unchanged (no copy, no collective).

    Args:
        tensors (Sequence[Tensor]): Floating-point (or complex) tensors.
            Every rank must pass the same number of tensors with the same
            shapes, dtypes and device types in the same order.
        group (ProcessGroup, optional): The process group. None means the
            default group. Defaults to None.

    Returns:
        list[Tensor]: The same tensor objects, now holding the averages.

    Raises:
        TypeError: A tensor is not floating point (integer or bool tensors
            cannot hold an average; cast them to a floating dtype first).

    Example:
        >>> import torch
        >>> from mmstats import scaled_all_reduce
        >>> grads = [torch.ones(3), torch.full((2, 2), 4.)]
        >>> out = scaled_all_reduce(grads)  # every rank calls it
        >>> out[0] is grads[0]  # in place: the same tensors, averaged
        True
    """
    tensors = list(tensors)
    try:
        dtypes = {tensor.dtype for tensor in tensors}
    except AttributeError:  # not a tensor
        _check_floating(tensors)
        raise
    if any(not (dtype.is_floating_point or dtype.is_complex)
           for dtype in dtypes):
        _check_floating(tensors)  # raises, naming the position
    return _coalesced_sum(tensors, group, average=True)


@torch.no_grad()
def sum_all_reduce(tensors: Sequence[Tensor],
                   group: Optional[object] = None) -> List[Tensor]:
    """Sum tensors in place over the processes of ``group``: the coalesced
    buckets of :func:`scaled_all_reduce`, without the division (any dtype
    that all_reduce can sum). Every rank must call it with the same
    tensors' shapes, dtypes and device types in the same order.

    Example:
        >>> import torch
        >>> from mmstats.dist import sum_all_reduce
        >>> sums = [torch.ones(3, dtype=torch.float64)]
        >>> sum_all_reduce(sums)[0] is sums[0]  # every rank calls it
        True
    """
    return _coalesced_sum(list(tensors), group, average=False)


def _coalesced_sum(tensors: List[Tensor], group: Optional[object],
                   average: bool) -> List[Tensor]:
    """One all_reduce SUM per (device, dtype) bucket, in a fixed order;
    divided by the world size if ``average``."""
    world_size = get_world_size(group)
    if world_size == 1 or not tensors:
        return tensors
    divisor = world_size if average else None
    if len({(t.device, t.dtype) for t in tensors}) == 1:  # no grouping
        _reduce_bucket(tensors, divisor, group)
        return tensors
    buckets: Dict[tuple, List[Tensor]] = {}
    for tensor in tensors:
        buckets.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for key in sorted(buckets, key=lambda k: (str(k[0]), str(k[1]))):
        _reduce_bucket(buckets[key], divisor, group)
    return tensors


def _reduce_bucket(bucket: List[Tensor], divisor: Optional[int],
                   group: Optional[object]) -> None:
    """Sum one (device, dtype) bucket with one all_reduce, then divide by
    ``divisor`` (None: keep the sum)."""
    if len(bucket) == 1 and bucket[0].is_contiguous():
        dist.all_reduce(bucket[0], op=dist.ReduceOp.SUM, group=group)
        if divisor is not None:
            bucket[0].div_(divisor)
        return
    one_dim = all(t.dim() == 1 for t in bucket)
    # cat of 1-D tensors is ~3x cheaper than the generic flatten
    flat = torch.cat(bucket) if one_dim else _flatten_dense_tensors(bucket)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    if divisor is not None:
        flat.div_(divisor)
    sizes = [t.numel() for t in bucket]
    try:  # 1-D destinations sharing the tensors' memory
        dests = bucket if one_dim else [t.view(-1) for t in bucket]
    except RuntimeError:  # a tensor whose memory cannot be viewed 1-D
        for tensor, part in zip(bucket, flat.split(sizes)):
            tensor.copy_(part.view(tensor.shape))
    else:  # one op: split and copy into the destinations (~2x cheaper
        # than creating the split views and a foreach copy)
        torch.split_with_sizes_copy(flat, sizes, out=dests)


#: process group -> a gloo group of its own over its ranks;
#: filled by host_group, the only writer
_HOST_GROUPS: Dict[Optional[object], object] = {}


def host_group(group: Optional[object] = None) -> Optional[object]:
    """A gloo process group of its own over the ranks of ``group``, for
    small CPU tensors (decisions all ranks take together): no device sync,
    and its collectives never queue behind (or hold up) the ones ``group``
    runs meanwhile, e.g. FSDP's all-gathers. Created on the first call for
    ``group`` and kept (every rank of the default group must make that
    first call, as for any group creation).

    Example:
        >>> from mmstats.dist import host_group
        >>> host_group() is None  # not distributed: the default group
        True
    """
    if not is_distributed():
        return group
    key = dist.group.WORLD if group is None else group  # a new default
    if key not in _HOST_GROUPS:  # group (re-initialised) gets a new one
        ranks = None if group is None else dist.get_process_group_ranks(group)
        _HOST_GROUPS[key] = dist.new_group(ranks=ranks, backend='gloo')
    return _HOST_GROUPS[key]


def slowest_rank(seconds: float) -> Optional[int]:
    """The rank whose ``seconds`` is the largest (the lowest such rank on a
    tie, at microsecond resolution), the same on every rank; None without
    distribution.

    One 1-element int64 all_reduce MAX of ``microseconds * world + (world -
    1 - rank)``: the cost does not grow with the world size.

    Example:
        >>> from mmstats.dist import slowest_rank
        >>> slowest_rank(0.25) is None  # not distributed; every rank calls it
        True
    """
    world = get_world_size()
    if world == 1:
        return None
    key = int(round(seconds * 1e6)) * world + (world - 1 - get_rank())
    largest = torch.tensor([key], dtype=torch.int64, device=get_comm_device())
    all_reduce(largest, op='max')
    return world - 1 - int(largest) % world
