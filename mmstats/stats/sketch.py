# Copyright (c) mmstats contributors. All rights reserved.
"""Mergeable quantile sketch kernels (DDSketch, Masson et al., VLDB 2019).

A sketch of a set of values is a fixed-size float64 vector of bucket
*counts*. Bucket ``k`` holds the magnitudes in ``(gamma^(k-1), gamma^k]``
with ``gamma = (1 + alpha) / (1 - alpha)``; its representative value
``2 gamma^k / (1 + gamma)`` is within ``alpha`` relative of every magnitude
in it. The vector is laid out in value order::

    [negative buckets, largest magnitude first | zero | positive buckets]

so a quantile is one cumulative sum and one search. The size only depends
on ``alpha`` and the magnitude range (not on the data or the world size):
sketches merge by addition, across ranks by one ``all_reduce`` SUM.
Magnitudes outside ``[min_value, max_value]`` are clamped into the edge
buckets (the accuracy guarantee holds inside the range); NaN / inf values
are not counted. See ``docs/quantiles.md``.
"""
import math
from typing import Dict, List, Sequence, Union

import numpy as np
import torch

__all__ = [
    'LogBuckets', 'DEFAULT_BUCKETS', 'bucket_counts', 'counts_in_order',
    'clamped_quantiles', 'group_bucket_counts', 'quantiles'
]

_F64 = torch.float64


class LogBuckets:
    """The bucket layout of a sketch: relative accuracy and value range.

    Args:
        relative_accuracy (float): ``alpha``: every quantile is within
            ``alpha`` relative of a true value of that rank. Defaults to
            0.01.
        min_value (float): Smallest magnitude with the guarantee; smaller
            non-zero magnitudes count in the lowest bucket. Defaults to 1e-9.
        max_value (float): Largest magnitude with the guarantee; larger
            finite magnitudes count in the highest bucket. Defaults to 1e9.
    """

    def __init__(self,
                 relative_accuracy: float = 0.01,
                 min_value: float = 1e-9,
                 max_value: float = 1e9) -> None:
        if not 0 < relative_accuracy < 1:
            raise ValueError('LogBuckets: relative_accuracy must be in (0, 1)'
                             f', e.g. 0.01, got {relative_accuracy!r}')
        if not 0 < min_value < max_value < math.inf:
            raise ValueError('LogBuckets: need 0 < min_value < max_value < '
                             f'inf, got min_value={min_value!r}, '
                             f'max_value={max_value!r}')
        self.relative_accuracy = float(relative_accuracy)
        self.min_value, self.max_value = float(min_value), float(max_value)
        mantissa = 2 * relative_accuracy / (1 - relative_accuracy)
        self.gamma = 1 + mantissa
        # 1 / ln(gamma), as in the ddsketch package's key mapping
        self.multiplier = 1 / math.log1p(mantissa)
        self.min_key = math.ceil(math.log(min_value) * self.multiplier)
        self.max_key = math.ceil(math.log(max_value) * self.multiplier)
        # buckets per sign; the zero bucket sits between the two signs
        self.num_buckets = self.max_key - self.min_key + 1
        self.zero_index = self.num_buckets
        self.size = 2 * self.num_buckets + 1
        keys = np.arange(self.min_key, self.max_key + 1, dtype=np.float64)
        magnitudes = np.power(self.gamma, keys) * (2 / (1 + self.gamma))
        self.values = np.concatenate([-magnitudes[::-1], [0.], magnitudes])

    def __repr__(self) -> str:
        return (f'LogBuckets(relative_accuracy={self.relative_accuracy}, '
                f'min_value={self.min_value}, max_value={self.max_value})')

    def _params(self) -> tuple:
        return self.relative_accuracy, self.min_value, self.max_value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogBuckets):
            return NotImplemented
        return self._params() == other._params()

    def __hash__(self) -> int:
        return hash(self._params())

    @property
    def nbytes(self) -> int:
        """Bytes of one float64 sketch (the memory per name)."""
        return self.size * 8

    # -- counting ------------------------------------------------------------
    def bucket_counts(self, values: torch.Tensor) -> torch.Tensor:
        """Sketch of ``values`` on their device, without a host sync.

        Only elementwise ops and a fixed-size histogram: ``torch.histc`` on
        CUDA, ``index_add_`` into a zeros tensor on CPU and under
        ``torch.use_deterministic_algorithms`` (``torch.bincount`` would size
        its output from the data: a sync on CUDA). Keys are computed in
        float64; counts are exact float64 integers.

        Args:
            values (Tensor): Values of any shape, real dtype and device.

        Returns:
            Tensor: ``(size, )`` float64 counts on ``values.device``.
        """
        x = values.detach().reshape(-1).to(_F64)
        # 1-based bucket of |x| within its sign: ceil(log_gamma |x|) less
        # (min_key - 1), clamped (0 -> log 0 = -inf -> 1, times sign 0)
        log_gamma = x.abs().log_().mul_(self.multiplier)
        offset = log_gamma.sub_(self.min_key - 1).ceil_()
        offset.clamp_(1, self.num_buckets)
        # x * 0 is NaN exactly for NaN / inf values: a spare last slot
        index = torch.addcmul(x * 0. + self.zero_index, torch.sign(x),
                              offset).nan_to_num_(float(self.size))
        if x.is_cuda and not torch.are_deterministic_algorithms_enabled():
            # per-block shared-memory histogram: index_add_'s global atomics
            # serialise on a popular bucket (zeros of a ReLU: 12x slower)
            return torch.histc(index, self.size + 1, -0.5,
                               self.size + 0.5)[:self.size]
        counts = torch.zeros(self.size + 1, dtype=_F64, device=x.device)
        ones = torch.ones(1, dtype=_F64, device=x.device).expand(x.numel())
        counts.index_add_(0, index.long(), ones)
        return counts[:self.size]

    def group_bucket_counts(self, x: np.ndarray, seg: np.ndarray,
                            groups: int) -> np.ndarray:
        """Sketches of host values, one per group (numpy ``bincount``).

        The host twin of :meth:`bucket_counts` for the flush path, grouped
        like :func:`~mmstats.stats.moments.reduce_groups`.

        Args:
            x (np.ndarray): 1-d float64 values.
            seg (np.ndarray): 1-d int64 group of each value, in
                ``[0, groups)``.
            groups (int): Number of groups.

        Returns:
            np.ndarray: ``(groups, size)`` float64 counts.
        """
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        seg = np.asarray(seg, dtype=np.int64).reshape(-1)
        with np.errstate(all='ignore'):
            finite = np.isfinite(x)
            if not finite.all():
                x, seg = x[finite], seg[finite]
            log_gamma = np.log(np.abs(x)) * self.multiplier
            offset = np.clip(
                np.ceil(log_gamma - (self.min_key - 1)), 1, self.num_buckets)
            index = np.sign(x) * offset + self.zero_index
        flat = seg * self.size + index.astype(np.int64)
        counts = np.bincount(flat, minlength=groups * self.size)
        return counts.reshape(groups, self.size).astype(np.float64)

    # -- querying ------------------------------------------------------------
    def quantiles(self, counts: Union[np.ndarray, torch.Tensor],
                  qs: Union[float, Sequence[float]]) -> np.ndarray:
        """Quantiles of a sketch, DDSketch's lower-rank convention.

        For ``q`` and ``n`` counted values, the answer is the representative
        of the bucket holding the value of 0-based rank ``floor(q (n - 1))``
        in sorted order (numpy's ``method='lower'``): within
        ``relative_accuracy`` of that value if its magnitude is in
        ``[min_value, max_value]`` (exactly 0 for 0).

        Args:
            counts (np.ndarray | Tensor): ``(..., size)`` counts (one sketch
                or a batch of them).
            qs (float | Sequence[float]): Quantiles in ``[0, 1]``.

        Returns:
            np.ndarray: ``(..., len(qs))`` float64 values (``(...)`` for a
            scalar ``qs``); NaN for an empty sketch.
        """
        if isinstance(counts, torch.Tensor):
            counts = counts.detach().cpu().numpy()
        counts = np.asarray(counts, dtype=np.float64)
        if counts.shape[-1] != self.size:
            raise ValueError(f'quantiles: counts must have {self.size} '
                             f'buckets (last dim) for {self!r}, got shape '
                             f'{counts.shape}')
        q = np.asarray(qs, dtype=np.float64)
        if q.size and not ((q >= 0) & (q <= 1)).all():
            raise ValueError(f'quantiles: qs must be in [0, 1], got {qs!r}')
        cum = np.cumsum(counts, axis=-1)
        total = cum[..., -1:]
        rank = np.floor(q.reshape(-1) * np.maximum(total - 1, 0))
        # first bucket whose cumulative count exceeds the rank
        index = (cum[..., None, :] <= rank[..., None]).sum(-1)
        out = self.values[np.minimum(index, self.size - 1)]
        out = np.where(total > 0, out, np.nan)
        return out.reshape(counts.shape[:-1] + q.shape)


DEFAULT_BUCKETS = LogBuckets()


def bucket_counts(values: torch.Tensor,
                  buckets: LogBuckets = DEFAULT_BUCKETS) -> torch.Tensor:
    """Sketch of ``values`` (see :meth:`LogBuckets.bucket_counts`)."""
    return buckets.bucket_counts(values)


def group_bucket_counts(x: np.ndarray,
                        seg: np.ndarray,
                        groups: int,
                        buckets: LogBuckets = DEFAULT_BUCKETS) -> np.ndarray:
    """Per-group sketches of host values (see
    :meth:`LogBuckets.group_bucket_counts`)."""
    return buckets.group_bucket_counts(x, seg, groups)


def quantiles(counts: Union[np.ndarray, torch.Tensor],
              qs: Union[float, Sequence[float]],
              buckets: LogBuckets = DEFAULT_BUCKETS) -> np.ndarray:
    """Quantiles of sketch counts (see :meth:`LogBuckets.quantiles`)."""
    return buckets.quantiles(counts, qs)


def counts_in_order(counts: Dict[str, np.ndarray],
                    names: List[str],
                    buckets: LogBuckets = DEFAULT_BUCKETS) -> np.ndarray:
    """``(len(names), size)`` counts of ``names`` in their order, zeros for
    names without any (names of ``counts`` not in ``names`` are dropped)."""
    block = np.zeros((len(names), buckets.size))
    for i, name in enumerate(names):
        if name in counts:
            block[i] = counts[name]
    return block


def clamped_quantiles(counts: np.ndarray,
                      qs: np.ndarray,
                      low: float,
                      high: float,
                      buckets: LogBuckets = DEFAULT_BUCKETS) -> np.ndarray:
    """Quantiles ``qs`` of a sketch whose exact extremes are ``low`` and
    ``high``: clamped into them (never less accurate), exact at 0 and 1."""
    out = np.clip(buckets.quantiles(counts, qs), low, high)
    return np.where(qs == 0, low, np.where(qs == 1, high, out))
