# Copyright (c) mmstats contributors. All rights reserved.
"""Histograms of merged (all-rank) quantile sketches, in the forms that
TensorBoard (``SummaryWriter.add_histogram_raw``) and W&B
(``wandb.Histogram(np_histogram=...)``) take: no raw value is touched.

A sketch bucket holds the magnitudes in ``(gamma^(k-1), gamma^k]``
(:mod:`mmstats.stats.sketch`); the histogram keeps those edges
(log-spaced, 2% wide at the default accuracy), with an empty bucket over
every gap between the buckets seen (TensorBoard reads a bucket as
``(previous limit, limit]``, so a gap must not widen its neighbour), the
first bucket starting at the exact minimum and the last ending at the
exact maximum. Collapsed magnitudes (:mod:`mmstats.stats.sketch`) are one
bucket per sign reaching to zero. More than ``max_buckets`` buckets are
merged in runs of equal length (counts added): still exact counts,
coarser edges. See
``docs/spikes_histograms.md``.
"""
import math
from typing import NamedTuple, Optional, Tuple

import numpy as np

from mmstats.stats.sketch import DEFAULT_BUCKETS, FIRST, LogBuckets, Sketch

__all__ = ['Histogram', 'sketch_histogram', 'numpy_histogram', 'MAX_BUCKETS']

#: Buckets per histogram by default: W&B's limit (512 bins), 8 KB of
#: limits and counts per name and publication in a TensorBoard event file.
MAX_BUCKETS = 512
_TINY = 5e-324  # the smallest positive float64


class Histogram(NamedTuple):
    """The arguments of TensorBoard's ``add_histogram_raw``.

    ``bucket_limits[i]`` is the upper edge of bucket ``i`` (inclusive), its
    lower edge ``bucket_limits[i - 1]`` (exclusive), or ``min`` for the
    first.

    Example:
        >>> import numpy as np
        >>> hist = Histogram(1., 3., 2., 4., 10., np.array([1., 3.]),
        ...                  np.array([1., 1.]))
        >>> hist._asdict()['num']
        2.0
    """
    min: float
    max: float
    num: float
    sum: float
    sum_squares: float
    bucket_limits: np.ndarray
    bucket_counts: np.ndarray


def _edges(codes: np.ndarray,
           buckets: LogBuckets) -> Tuple[np.ndarray, np.ndarray]:
    """Lower and upper value edges of the sorted signed ``codes`` (kept,
    zero and collapsed ones)."""
    mags = np.abs(codes)
    bottom, top = buckets.magnitude_bounds(codes)
    kept = mags >= FIRST
    # collapsed magnitudes lie below every kept one of their sign
    pos_kept = codes[codes >= FIRST]
    neg_kept = codes[codes <= -FIRST]
    pos_floor = bottom[codes == pos_kept[0]][0] if pos_kept.size else 1.
    neg_floor = bottom[codes == neg_kept[-1]][0] if neg_kept.size else 1.
    low = np.where(codes > 0, bottom, -top)
    high = np.where(codes > 0, top, -bottom)
    # as TensorBoard reads them, (low, high]: zero is (-TINY, 0], collapsed
    # magnitudes (0, floor] and (-floor, -TINY]
    low = np.where(kept, low, np.where(codes > 0, 0., -neg_floor))
    high = np.where(kept, high, np.where(codes > 0, pos_floor, -_TINY))
    low = np.where(mags == 0, -_TINY, low)
    high = np.where(mags == 0, 0., high)
    return low, high


def sketch_histogram(sketch: Sketch,
                     num: float,
                     mean: float,
                     std: float,
                     low: float,
                     high: float,
                     max_buckets: int = MAX_BUCKETS,
                     buckets: LogBuckets = DEFAULT_BUCKETS
                     ) -> Optional[Histogram]:
    """The histogram of a merged sketch and the exact moments of the same
    values (a :class:`~mmstats.Collector`'s ``num``, ``mean``, ``std``,
    ``min``, ``max``).

    Args:
        sketch (Sketch): The merged bucket counts.
        num (float): Number of finite values.
        mean (float): Their mean.
        std (float): Their population std.
        low (float): Their minimum.
        high (float): Their maximum.
        max_buckets (int): At most this many buckets (runs of adjacent
            buckets are merged beyond). Defaults to ``MAX_BUCKETS`` (512).
        buckets (LogBuckets): The sketch's layout. Defaults to
            ``DEFAULT_BUCKETS``.

    Returns:
        Histogram | None: None for no finite value.

    Example:
        >>> import numpy as np, torch
        >>> from mmstats.stats.sketch import bucket_counts
        >>> values = torch.tensor([-1., 0., 1., 1., 2.])
        >>> hist = sketch_histogram(bucket_counts(values), 5, 0.6, 1.0198,
        ...                         -1., 2.)
        >>> hist.bucket_counts.tolist()  # empty buckets over the gaps
        [1.0, 0.0, 1.0, 0.0, 2.0, 0.0, 1.0]
        >>> hist.bucket_limits[[0, 2, 4, 6]].round(3).tolist()  # -1: (.., -1]
        [-1.0, 0.0, 1.0, 2.0]
        >>> hist.num, hist.sum, round(hist.sum_squares, 3)
        (5.0, 3.0, 7.0)
    """
    if not num > 0 or not sketch.codes.size:
        return None
    codes = sketch.codes
    lows, highs = _edges(codes, buckets)
    # an empty bucket where a bucket starts above the previous one's end
    gap = np.zeros(codes.size, dtype=bool)
    gap[1:] = lows[1:] > highs[:-1]
    limits = np.empty(codes.size + int(gap.sum()))
    counts = np.zeros_like(limits)
    at = np.arange(codes.size) + np.cumsum(gap)  # where each bucket goes
    limits[at] = highs
    counts[at] = sketch.counts
    limits[at[gap] - 1] = lows[gap]
    limits[-1] = high  # the exact maximum ends the last bucket
    if limits.size > max_buckets:
        run = math.ceil(limits.size / max_buckets)
        starts = np.arange(0, limits.size, run)
        counts = np.add.reduceat(counts, starts)
        limits = limits[np.minimum(starts + run, limits.size) - 1]
    total = float(num)
    return Histogram(
        min=float(low),
        max=float(high),
        num=total,
        sum=float(total * mean),
        sum_squares=float(total * (std * std + mean * mean)),
        bucket_limits=limits,
        bucket_counts=counts)


def numpy_histogram(hist: Histogram) -> Tuple[np.ndarray, np.ndarray]:
    """``(counts, edges)`` as ``numpy.histogram`` returns them (``edges``
    one longer, starting at ``min``): W&B's ``np_histogram``.

    Example:
        >>> import numpy as np
        >>> hist = Histogram(1., 3., 2., 4., 10., np.array([1., 3.]),
        ...                  np.array([1., 1.]))
        >>> counts, edges = numpy_histogram(hist)
        >>> counts.tolist(), edges.tolist()
        ([1.0, 1.0], [1.0, 1.0, 3.0])
    """
    edges = np.concatenate([[hist.min], hist.bucket_limits])
    return hist.bucket_counts, edges
