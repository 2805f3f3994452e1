# Copyright (c) mmstats contributors. All rights reserved.
"""What throughput is made of: the rows of a data batch
(:func:`batch_rows`) and one interval's figures over all ranks in one
collective (:func:`reduce_interval`; its arithmetic over the gathered rows,
without a collective: :func:`combine_rows`)."""
import math
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from mmengine.dist import all_gather, get_world_size

from mmstats.dist import host_group

__all__ = ['batch_rows', 'reduce_interval', 'combine_rows']


def _field_rows(field: Any) -> Optional[int]:
    """The rows of one batched field: a tensor's first dimension, a list's
    length (one item per sample), a dict's first value's rows."""
    if isinstance(field, torch.Tensor):
        return int(field.shape[0]) if field.dim() else None
    if isinstance(field, (list, tuple)):
        return len(field)
    if isinstance(field, dict) and field:
        return _field_rows(next(iter(field.values())))
    return None


def batch_rows(data_batch: Any) -> Optional[int]:
    """The number of samples in ``data_batch`` as the Runner's DataLoader
    yields it (before the data preprocessor), or None where it cannot be
    told. Host metadata only (a tensor's shape): no device sync.

    The samples are the rows of the batch's first field: the ``'inputs'``
    of a dict batch (mmengine's convention; else its first value), the
    first element of a list or tuple batch (a tuple of batched fields, as
    ``default_collate`` makes of tuple samples); a field's rows are a
    tensor's first dimension, a list's length (``pseudo_collate``: one
    item per sample) or, for a dict of fields, its first value's rows.

    Example:
        >>> import torch
        >>> batch_rows(dict(inputs=torch.zeros(5, 3), data_samples=[0] * 5))
        5
        >>> batch_rows(dict(inputs=[torch.zeros(3)] * 7))  # pseudo_collate
        7
        >>> batch_rows((torch.zeros(4, 2), torch.zeros(4)))  # (x, y)
        4
        >>> batch_rows(torch.tensor(3.)) is None  # no rows to count
        True
    """
    if isinstance(data_batch, dict):
        if not data_batch:
            return None
        first = data_batch['inputs'] if 'inputs' in data_batch else next(
            iter(data_batch.values()))
        return _field_rows(first)
    if isinstance(data_batch, (list, tuple)):
        return _field_rows(data_batch[0]) if data_batch else None
    return _field_rows(data_batch)


def reduce_interval(
    maxima: Dict[str, Optional[float]],
    sums: Dict[str, Optional[float]],
    group: Optional[object] = None
) -> Tuple[Dict[str, Optional[Tuple[float, int]]], Dict[str, Optional[float]]]:
    """Each of ``maxima``'s figures as ``(max over ranks, the rank holding
    it)`` and each of ``sums``'s as the sum over ranks, in one all_gather of
    a float64 vector over a gloo group of the ranks of ``group``
    (:func:`mmstats.dist.host_group`: CPU tensors, no device sync). A figure
    that is None on any rank is None on every rank. Every rank must call it
    with the same keys in the same order; every rank gets the same bits
    (the sums are added in rank order), and a tie goes to the lowest rank.

    Example:
        >>> maxima, sums = reduce_interval(dict(memory=512.0),
        ...                                dict(samples=16.0, flops=None))
        >>> maxima, sums  # one process: its own figures, rank 0
        ({'memory': (512.0, 0)}, {'samples': 16.0, 'flops': None})
    """
    values = [math.nan if v is None else float(v) for v in maxima.values()]
    values += [math.nan if v is None else float(v) for v in sums.values()]
    if get_world_size(group) == 1:
        rows = [values]
    else:
        mine = torch.tensor(values, dtype=torch.float64)
        rows = [t.tolist() for t in all_gather(mine, host_group(group))]
    return combine_rows(list(maxima), list(sums), rows)


def combine_rows(
    maxima: Sequence[str], sums: Sequence[str], rows: Sequence[Sequence[float]]
) -> Tuple[Dict[str, Optional[Tuple[float, int]]], Dict[str, Optional[float]]]:
    """The reduction of :func:`reduce_interval` over every rank's ``row``
    (in rank order: the values of the ``maxima`` names, then those of the
    ``sums`` names, NaN for None): each of ``maxima`` as ``(max, the rank
    holding it)``, the lowest rank on a tie, and each of ``sums`` as the
    sum in rank order; None where any rank's value is NaN. A pure function
    of the rows: no collective.

    Example:
        >>> nan = float('nan')
        >>> combine_rows(['memory'], ['samples', 'flops'],
        ...              [[512.0, 16.0, 9.0], [640.0, 8.0, nan]])
        ({'memory': (640.0, 1)}, {'samples': 24.0, 'flops': None})
    """
    out_max: Dict[str, Optional[Tuple[float, int]]] = {}
    for i, name in enumerate(maxima):
        column = [row[i] for row in rows]
        if any(math.isnan(v) for v in column):
            out_max[name] = None
        else:
            rank = max(range(len(column)), key=lambda r: (column[r], -r))
            out_max[name] = (column[rank], rank)
    out_sum: Dict[str, Optional[float]] = {}
    for i, name in enumerate(sums, start=len(maxima)):
        total = 0.0
        for row in rows:
            total += row[i]
        out_sum[name] = None if math.isnan(total) else total
    return out_max, out_sum
