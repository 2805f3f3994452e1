# Copyright (c) mmstats contributors. All rights reserved.
"""Pure float64 moment kernels: reduce values to rows, merge rows.

A *row* summarises a set of values in ``ROW_WIDTH`` float64 numbers, in the
column order of the constants below: ``[n, mean, M2, min, max, nonfinite]``
with ``n`` the number of finite values, ``M2`` the sum of their squared
deviations from ``mean`` and ``nonfinite`` the number of NaN / inf values
(kept out of every other column). Rows merge exactly with Chan et al.'s
parallel formula, so reductions can happen in any grouping and order.
"""
import math
from fractions import Fraction
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from mmstats.utils.torch_compat import aminmax

__all__ = [
    'N', 'MEAN', 'M2', 'MIN', 'MAX', 'NONFINITE', 'ROW_WIDTH', 'empty_rows',
    'reduce_values', 'reduce_tensor', 'reduce_in_graph', 'reduce_groups',
    'merge_rows', 'compact_tensors', 'compact_rows'
]

# Columns of a moments row.
N, MEAN, M2, MIN, MAX, NONFINITE = range(6)
ROW_WIDTH = 6

_INF = float('inf')
_F64 = torch.float64


def empty_rows(num: int, device: Any = None) -> torch.Tensor:
    """Rows of ``num`` groups without values: n=0, min=+inf, max=-inf.

    Example:
        >>> empty_rows(1).tolist()  # n, mean, M2, min, max, nonfinite
        [[0.0, 0.0, 0.0, inf, -inf, 0.0]]
    """
    rows = torch.zeros(num, ROW_WIDTH, dtype=_F64, device=device)
    rows[:, MIN] = _INF
    rows[:, MAX] = -_INF
    return rows


def reduce_values(x: torch.Tensor) -> torch.Tensor:
    """Reduce float64 values to one row, on their device, without a sync.

    Corrected two-pass algorithm (no ``E[x^2] - E[x]^2``). Only sync-free
    ops (``nan_to_num`` instead of boolean masks), so it can run in
    ``report()`` on CUDA tensors.

    Args:
        x (Tensor): 1-d float64 values.

    Returns:
        Tensor: ``(1, ROW_WIDTH)`` row.

    Example:
        >>> import torch
        >>> x = torch.tensor([1., 3., float('inf')], dtype=torch.float64)
        >>> reduce_values(x).tolist()
        [[2.0, 2.0, 2.0, 1.0, 3.0, 1.0]]
    """
    finite_or_zero = torch.nan_to_num(x, 0., 0., 0.)
    is_bad = torch.nan_to_num(x * 0., 1., 1., 1.)  # 1 where non-finite
    nonfinite = is_bad.sum().reshape(1)
    n = x.numel() - nonfinite
    n_safe = n.clamp(min=1)
    mean = finite_or_zero.sum().reshape(1) / n_safe
    dev = torch.nan_to_num(x - mean, 0., 0., 0.)
    mean_fix = dev.sum().reshape(1) / n_safe
    m2 = torch.dot(dev, dev).reshape(1) - mean_fix * mean_fix * n
    if x.numel():
        low = torch.nan_to_num(x, _INF, _INF, _INF).amin().reshape(1)
        high = torch.nan_to_num(x, -_INF, -_INF, -_INF).amax().reshape(1)
    else:
        low = torch.full((1, ), _INF, dtype=_F64, device=x.device)
        high = torch.full((1, ), -_INF, dtype=_F64, device=x.device)
    return torch.stack(
        [n, mean + mean_fix,
         m2.clamp(min=0), low, high, nonfinite], dim=1)


def reduce_tensor(x: torch.Tensor,
                  sync_free: Optional[bool] = None,
                  workspace: Optional[Dict[Any, torch.Tensor]] = None
                  ) -> torch.Tensor:
    """Reduce a real tensor of any shape and dtype to one row.

    A fixed, small number of fused passes (``docs/reporting.md``):

    - CPU (``sync_free=False``): ``aminmax`` of the values, read on the
      host (a CPU scalar, not a device sync); if both are finite, so is
      every value, and :func:`_reduce_finite_cpu` gives the row from one
      float64 copy: 6-9 dispatcher calls in all (6 for float32 values
      around zero, 7 far from it, one more for float16), never more than
      StyleGAN3's ``report``. Only a tensor with NaN / inf takes the masked
      :func:`reduce_values`.
    - other devices (``sync_free=True``): ``var_mean`` and ``aminmax`` of
      the values with every non-finite one replaced by the mean of the
      finite ones (which changes neither ``M2`` nor the range), so no host
      read is needed: 11 dispatcher calls at any size; rows without finite
      values carry NaN moments and are emptied by :func:`merge_rows`.

    Args:
        x (Tensor): Real values, any shape.
        sync_free (bool, optional): Force the device path (also on CPU,
            to test it). Defaults to None (by device).
        workspace (dict, optional): The caller's scratch memory for the CPU
            path's copies (at most ``WORKSPACE_BYTES``, reused by the next
            call of the same size: no fresh allocation to page in every
            call). Only one thread may use it at a time. Defaults to None
            (fresh copies).

    Returns:
        Tensor: ``(ROW_WIDTH, )`` float64 row on ``x``'s device.

    Example:
        >>> import torch
        >>> row = reduce_tensor(torch.tensor([1., 2., 3., float('nan')]))
        >>> row.tolist()  # n, mean, M2, min, max, nonfinite
        [3.0, 2.0, 2.0, 1.0, 3.0, 1.0]
    """
    flat = x if x.dim() == 1 else x.reshape(-1)
    numel = flat.numel()
    if sync_free is None:
        sync_free = flat.device.type != 'cpu'
    if not numel:
        return empty_rows(1, flat.device)[0]
    if not flat.is_floating_point():  # int, bool: exact in float64
        flat = flat.to(_F64)
    if sync_free:
        return _reduce_sync_free(flat)
    low, high = (t.tolist() for t in aminmax(flat))
    if not (math.isfinite(low) and math.isfinite(high)):
        return reduce_values(flat.to(_F64))[0]
    return _reduce_finite_cpu(flat, low, high, workspace)


# The sum of squares at most this many times the M2 it gives: M2 within
# ~256 ulps of the pairwise sums' errors (~1e-14), else the two-pass.
_MAX_CANCELLATION = 256.
# Up to this many values of 24 significant bits or fewer within a factor of
# two of each other, their float64 (pairwise) sum is exact.
_EXACT_SUM_NUMEL = 2**28

# Float64 copies (and float16's float32 ones) of at most this many bytes in
# all are kept in a caller's workspace between calls: a large report() then
# writes to memory it used before, not to a fresh allocation that the C
# allocator may map, and page-fault in, anew every call (~3x the whole
# reduction's time at 1 M values on a loaded machine).
WORKSPACE_BYTES = 32 * 2**20

# Compiled code's sums of more than 4 chunks go by chunks of this many values.
IN_GRAPH_CHUNK = 1024


def _workspace_copy(flat: torch.Tensor, dtype: torch.dtype,
                    workspace: Optional[Dict[Any,
                                             torch.Tensor]]) -> torch.Tensor:
    """``flat``'s values cast to ``dtype`` in ``workspace`` (one ``copy_``;
    an ``empty`` too the first time a size is seen), to be overwritten by
    the next call with as many values: scratch, never returned. A fresh
    copy without a workspace or beyond ``WORKSPACE_BYTES``."""
    numel = flat.numel()
    nbytes = numel * dtype.itemsize
    if workspace is None or nbytes > WORKSPACE_BYTES:
        return flat.to(dtype, copy=True)
    buffer = workspace.get((numel, dtype))
    if buffer is None:
        if nbytes + sum(b.nbytes
                        for b in workspace.values()) > WORKSPACE_BYTES:
            workspace.clear()
        buffer = workspace[numel, dtype] = torch.empty(numel, dtype=dtype)
    return buffer.copy_(flat)


def _reduce_finite_cpu(flat: torch.Tensor,
                       low: float,
                       high: float,
                       workspace: Optional[Dict[Any, torch.Tensor]] = None
                       ) -> torch.Tensor:
    """The row of non-empty 1-d finite floating-point CPU values with
    extremes ``low`` and ``high``, in float64 (host reads of CPU scalars).

    One float64 copy of the values and its (pairwise) sum, then:

    - values around zero (not all of one sign within a factor of two):
      the copy squared in place and summed (pairwise), ``M2 = sum(x^2) -
      sum(x)^2 / n``, kept if the sum of squares is at most
      ``_MAX_CANCELLATION`` times ``M2`` (``|mean| <= 16 std``: the
      cancellation costs at most 8 bits of float64's 53). Above
      (outliers, rare), the two-pass: the copy made again, shifted in
      place by the mean, squared and summed (one ATen op more than
      StyleGAN3's report there);
    - values of one sign within a factor of two of each other (a mean far
      from zero against the spread): the copy shifted in place by the mean
      ``c`` (exact: Sterbenz), then squared and summed. float32 / float16
      / bfloat16 values have 24 significant bits or fewer, so their sum,
      hence ``sum(x - c) = sum(x) - n c``, is exact: ``M2 = sum((x -
      c)^2) - sum(x - c)^2 / n`` without a third pass. float64 values sum
      their deviations.

    float32: 5 or 6 dispatcher calls (9 for the refined sum of squares);
    float16 values go through float32 (~2x faster than float16 ->
    float64 on CPU): one more. The copies go to :func:`_workspace_copy`.
    """
    numel = flat.numel()
    if flat.dtype is torch.float16:
        flat = _workspace_copy(flat, torch.float32, workspace)
    values = _workspace_copy(flat, _F64, workspace)
    total = values.sum().tolist()
    mean = total / numel
    if not (0. < low and high <= 2. * low or high < 0. and low >= 2. * high):
        squares = values.square_().sum().tolist()
        m2 = squares - total * mean
        if squares <= _MAX_CANCELLATION * m2:
            return _row(numel, mean, m2, low, high)
        # the two-pass on the copy made again (it was squared in place),
        # summed pairwise: a BLAS dot's error depends on its thread count
        # (up to 4e-12 relative at 1 M values with one thread)
        dev = _workspace_copy(flat, _F64, workspace).sub_(mean)
        return _row(numel, mean, dev.square_().sum().tolist(), low, high)
    shift = min(max(mean, low), high)
    dev = values.sub_(shift)
    if flat.dtype is not _F64 and numel <= _EXACT_SUM_NUMEL:
        dev_total = float(Fraction(total) - numel * Fraction(shift))
    else:
        dev_total = dev.sum().tolist()
    m2 = dev.square_().sum().tolist() - dev_total * dev_total / numel
    return _row(numel, shift + dev_total / numel, m2, low, high)


def _row(numel: int, mean: float, m2: float, low: float,
         high: float) -> torch.Tensor:
    """The CPU row of finite values (one dispatcher call)."""
    return torch.tensor([numel, mean, max(m2, 0.), low, high, 0.], dtype=_F64)


def _reduce_sync_free(flat: torch.Tensor) -> torch.Tensor:
    """The row of non-empty 1-d floating-point values, without a host
    read: non-finite values replaced by the finite mean."""
    flat = flat.to(_F64)  # (a 0-d float64 fill would not promote float32)
    zeroed = torch.nan_to_num(flat, 0., 0., 0.)
    is_finite = zeroed == flat  # NaN != 0, inf != 0
    n = is_finite.sum(dtype=_F64)
    filled = torch.where(is_finite, flat, zeroed.sum() / n)
    m2, mean = torch.var_mean(filled, correction=filled.numel() - 1)
    low, high = aminmax(filled)
    return torch.stack([n, mean, m2, low, high, filled.numel() - n])


def reduce_in_graph(x: torch.Tensor) -> torch.Tensor:
    """Reduce real values to one row with ops a compiler fuses into one loop.

    What compiled ``report()`` traces into the graph (``docs/reporting.md``):
    no host read, no data-dependent shape, only elementwise ops and float64
    sums, which inductor fuses into one loop over the values (inside the
    kernel that produces them) after a short one over their first
    ``m = ceil(n / 256)``: the shift ``c``, the mean of the finite values
    among those. Then ``M2 = sum((x - c)^2) - sum(x - c)^2 / n``. As the
    first ``m`` values' squared deviations from the mean sum to at most
    ``M2``, ``(c - mean)^2 <= M2 / m``: the sum of squares is at most ``1 +
    n / m <= 257`` times ``M2``, the bound of :func:`_reduce_finite_cpu`'s
    one-pass (at most 8 of float64's 53 bits lost). Only when all of those
    first values are NaN / inf (then ``c = 0``) is there no such bound.
    Beyond ``4 * IN_GRAPH_CHUNK`` values the sums go by chunks of
    ``IN_GRAPH_CHUNK``, then over the chunks: inductor's CPU loops sum
    float64 without a cascade, and the error of one long sum grows with
    its length.

    Args:
        x (Tensor): Non-empty real values (float, int or bool), any shape.

    Returns:
        Tensor: ``(ROW_WIDTH, )`` float64 row on ``x``'s device.

    Example:
        >>> import torch
        >>> x = torch.tensor([1., 3., float('nan')])
        >>> reduce_in_graph(x).tolist()  # n, mean, M2, min, max, nonfinite
        [2.0, 2.0, 2.0, 1.0, 3.0, 1.0]
    """
    flat = x.reshape(-1)
    if not flat.is_floating_point():  # int, bool: exact in float64
        flat = flat.to(_F64)
    numel = flat.numel()
    if numel == 1:  # a loss, a norm: pointwise, no reduction
        value = flat[0].to(_F64)
        finite = torch.isfinite(value).to(_F64)
        return _as_row(finite, torch.nan_to_num(value * finite, 0., 0., 0.),
                       torch.zeros_like(value),
                       torch.nan_to_num(value, _INF, _INF, _INF),
                       torch.nan_to_num(value, -_INF, -_INF, -_INF),
                       1 - finite)
    head = flat[:(numel + 255) // 256].to(_F64)
    head_finite = (head - head) == 0  # isfinite: 2 vector ops, not 6
    shift = torch.where(head_finite, head,
                        0.).sum() / head_finite.sum(dtype=_F64).clamp(min=1)
    if numel > 4 * IN_GRAPH_CHUNK:  # NaN padding: counted nowhere
        flat = torch.nn.functional.pad(
            flat, (0, -numel % IN_GRAPH_CHUNK), value=math.nan)
    chunks = flat.view(-1,
                       IN_GRAPH_CHUNK if numel > 4 * IN_GRAPH_CHUNK else numel)
    finite = (chunks - chunks) == 0  # NaN for NaN and inf
    dev = torch.where(finite, chunks.to(_F64) - shift, 0.)
    n = finite.sum(1, dtype=torch.int32).sum(dtype=_F64)  # ints: no casts
    dev_sum = dev.sum(1).sum()
    m2 = (dev * dev).sum(1).sum() - dev_sum * dev_sum / n.clamp(min=1)
    # extremes in the values' own dtype: exact, twice the vector lanes
    low = torch.where(finite, chunks, _INF).amin(1).amin().to(_F64)
    high = torch.where(finite, chunks, -_INF).amax(1).amax().to(_F64)
    return _as_row(n, shift + dev_sum / n.clamp(min=1), m2.clamp(min=0), low,
                   high, numel - n)


def _as_row(*columns: torch.Tensor) -> torch.Tensor:
    """The row of 0-d float64 ``columns``, as one elementwise select: a
    ``stack`` would cost inductor's wrapper a view per column."""
    index = torch.arange(ROW_WIDTH, device=columns[0].device)
    row = columns[-1].expand(ROW_WIDTH)
    for i in range(ROW_WIDTH - 2, -1, -1):
        row = torch.where(index == i, columns[i], row)
    return row


def reduce_groups(x: np.ndarray, seg: np.ndarray, groups: int) -> np.ndarray:
    """Reduce host values to one row per group (numpy).

    The same corrected two-pass algorithm as :func:`reduce_values`, grouped
    by ``seg``: numpy's ``bincount`` / ``reduceat`` cost a fraction of the
    torch ops' dispatch on small arrays.

    Args:
        x (np.ndarray): 1-d float64 values.
        seg (np.ndarray): 1-d int64 group of each value.
        groups (int): Number of groups.

    Returns:
        np.ndarray: ``(groups, ROW_WIDTH)`` rows; groups without values get
        empty rows.

    Example:
        >>> import numpy as np
        >>> reduce_groups(np.array([1., 3., 5.]), np.array([0, 0, 1]),
        ...               2).tolist()
        [[2.0, 2.0, 2.0, 1.0, 3.0, 0.0], [1.0, 5.0, 0.0, 5.0, 5.0, 0.0]]
    """
    rows = np.zeros((groups, ROW_WIDTH))
    rows[:, MIN], rows[:, MAX] = _INF, -_INF
    if not x.size:
        return rows
    with np.errstate(all='ignore'):
        finite = np.isfinite(x)
        counts = np.bincount(seg, minlength=groups)
        all_finite = bool(finite.all())  # host array: no device sync
        if all_finite:  # common case: no masking needed
            n, low, high = counts.astype(np.float64), x, x
        else:
            n = np.bincount(seg, weights=finite, minlength=groups)
            low, high = np.where(finite, x, _INF), np.where(finite, x, -_INF)
            x = np.where(finite, x, 0.)
        n_safe = np.maximum(n, 1)
        mean = np.bincount(seg, weights=x, minlength=groups) / n_safe
        dev = x - mean[seg]
        if not all_finite:
            dev[~finite] = 0.
        mean_fix = np.bincount(seg, weights=dev, minlength=groups) / n_safe
        m2 = np.bincount(seg, weights=dev * dev, minlength=groups)
        # min/max per run of equal groups, then per group
        starts = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
        np.minimum.at(rows[:, MIN], seg[starts],
                      np.minimum.reduceat(low, starts))
        np.maximum.at(rows[:, MAX], seg[starts],
                      np.maximum.reduceat(high, starts))
        rows[:, N] = n
        rows[:, MEAN] = mean + mean_fix
        rows[:, M2] = np.maximum(m2 - mean_fix * mean_fix * n, 0.)
        rows[:, NONFINITE] = counts - n
    return rows


def merge_rows(rows: torch.Tensor, seg: torch.Tensor,
               groups: int) -> torch.Tensor:
    """Merge rows per group (Chan et al.'s parallel formula).

    ``M2 = sum_i M2_i + n_i (mean_i - mean)^2``: exact and stable; min/max
    and counts combine directly. Deterministic: the same rows give the same
    bits on every rank.

    Args:
        rows (Tensor): ``(R, ROW_WIDTH)`` float64 rows.
        seg (Tensor): ``(R, )`` int64 group of each row.
        groups (int): Number of groups.

    Returns:
        Tensor: ``(groups, ROW_WIDTH)`` merged rows.

    Example:
        >>> import torch
        >>> rows = torch.stack([reduce_tensor(torch.tensor([1., 3.])),
        ...                     reduce_tensor(torch.tensor([5.]))])
        >>> merge_rows(rows, torch.tensor([0, 0]), 1).tolist()  # Chan
        [[3.0, 3.0, 8.0, 1.0, 5.0, 0.0]]
    """
    device = rows.device
    zeros = torch.zeros(groups, dtype=_F64, device=device)
    # A row without finite values may carry NaN moments (sync-free path).
    has_values = (rows[:, N] > 0).unsqueeze(1)
    rows = torch.where(has_values, rows, _empty_like_rows(rows))
    n_i, mean_i = rows[:, N], rows[:, MEAN]
    n = zeros.index_add(0, seg, n_i)
    n_safe = n.clamp(min=1)
    mean = zeros.index_add(0, seg, n_i * mean_i) / n_safe
    dev = mean_i - mean[seg]
    mean = mean + zeros.index_add(0, seg, n_i * dev) / n_safe
    dev = mean_i - mean[seg]
    m2 = zeros.index_add(0, seg, rows[:, M2] + n_i * dev * dev)
    low = torch.full((groups, ), _INF, dtype=_F64, device=device)
    low = low.scatter_reduce(0, seg, rows[:, MIN], 'amin')
    high = torch.full((groups, ), -_INF, dtype=_F64, device=device)
    high = high.scatter_reduce(0, seg, rows[:, MAX], 'amax')
    nonfinite = zeros.index_add(0, seg, rows[:, NONFINITE])
    return torch.stack([n, mean, m2, low, high, nonfinite], dim=1)


def _empty_like_rows(rows: torch.Tensor) -> torch.Tensor:
    """Empty rows that keep ``rows``' non-finite counts."""
    empty = empty_rows(len(rows), rows.device)
    empty[:, NONFINITE] = rows[:, NONFINITE]
    return empty


def compact_tensors(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Reduce float64 tensors to one row per device (no device sync).

    Example:
        >>> import torch
        >>> values = [torch.tensor([1., 3.]).double(),
        ...           torch.tensor([5.]).double()]
        >>> [row.tolist() for row in compact_tensors(values)]
        [[3.0, 3.0, 8.0, 1.0, 5.0, 0.0]]
    """
    try:  # common case: same shape and device, one op
        flats = [torch.stack(tensors).reshape(-1)]
    except RuntimeError:
        by_device: Dict[Any, List[torch.Tensor]] = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t.reshape(-1))
        flats = [torch.cat(ts) for ts in by_device.values()]
    return [reduce_tensor(flat) for flat in flats]


def compact_rows(rows: List[torch.Tensor]) -> List[torch.Tensor]:
    """Merge rows to one row per device (no sync).

    Example:
        >>> import torch
        >>> rows = [reduce_tensor(torch.tensor([1., 3.])),
        ...         reduce_tensor(torch.tensor([5.]))]
        >>> [row.tolist() for row in compact_rows(rows)]
        [[3.0, 3.0, 8.0, 1.0, 5.0, 0.0]]
    """
    by_device: Dict[Any, List[torch.Tensor]] = {}
    for row in rows:
        by_device.setdefault(row.device, []).append(row)
    merged = []
    for same_device in by_device.values():
        stacked = torch.stack(same_device)
        seg = torch.zeros(
            len(same_device), dtype=torch.long, device=stacked.device)
        merged.append(merge_rows(stacked, seg, 1)[0])
    return merged
