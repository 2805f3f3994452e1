# Copyright (c) mmstats contributors. All rights reserved.
"""The sketches' part of the update's SUM collective (see
``docs/quantiles.md``).

Every rank knows each name's global finite ``[low, high]`` from the MAX
collective that precedes the SUM. From it alone (so identically on every
rank) :func:`layout` gives each name a dense block::

    [negative keys, largest magnitude first | collapsed negative | zero |
     collapsed positive | positive keys]

covering the keys between the name's extreme magnitudes (plus one bucket of
margin each side), at most
``max_buckets`` per sign, and at most ``max_total`` for all names (a level
that caps the widest sides, the same on every rank). A rank adds its sparse
counts into the blocks; the SUM is exact (integers < 2^53).
"""
from typing import Dict, List, Optional

import numpy as np

from .sketch import COLLAPSED, DEFAULT_BUCKETS, FIRST, LogBuckets, Sketch

__all__ = ['SketchSum', 'layout']


def _grant(need: np.ndarray, budget: int) -> np.ndarray:
    """``min(need, level)`` with the largest ``level`` whose total fits in
    ``budget`` (at least 1 per side that needs any)."""
    if need.sum() <= budget:
        return need
    lo, hi = 1, int(need.max())
    while lo < hi:  # largest level with sum(min(need, level)) <= budget
        mid = (lo + hi + 1) // 2
        if np.minimum(need, mid).sum() <= budget:
            lo = mid
        else:
            hi = mid - 1
    return np.minimum(need, lo)


def layout(low: np.ndarray,
           high: np.ndarray,
           buckets: LogBuckets = DEFAULT_BUCKETS) -> tuple:
    """Per name: the magnitude codes kept per sign and the block offsets.

    Args:
        low (np.ndarray): ``(T, )`` global finite minimum (inf if none).
        high (np.ndarray): ``(T, )`` global finite maximum (-inf if none).

    Returns:
        tuple: ``(neg_top, neg_count, pos_bottom, pos_count, offsets)``,
        int64 arrays; ``offsets`` has ``T + 1`` entries.

    Example:
        >>> import numpy as np
        >>> low, high = np.array([1., -2.]), np.array([4., -1.])
        >>> _, neg_count, _, pos_count, offsets = layout(low, high)
        >>> neg_count.tolist(), pos_count.tolist()  # keys + margins
        ([0, 37], [73, 0])
        >>> offsets.tolist()  # each block: neg_count + 3 + pos_count
        [0, 76, 116]
    """
    has = high >= low
    top_code = buckets.max_key - buckets.min_key + FIRST
    with np.errstate(invalid='ignore'):
        pos = has & (high > 0)
        neg = has & (low < 0)
        one = np.ones_like(low)

        def code(values: np.ndarray) -> np.ndarray:  # magnitude codes
            return np.abs(buckets.codes(values))

        pos_top = np.minimum(code(np.where(pos, high, one)) + 1, top_code)
        pos_low = np.where(pos & (low > 0),
                           code(np.where(pos, low, one)) - 1, FIRST)
        neg_top = np.minimum(code(np.where(neg, low, -one)) + 1, top_code)
        neg_low = np.where(neg & (high < 0),
                           code(np.where(neg, high, -one)) - 1, FIRST)
    need = np.concatenate([
        np.where(pos, pos_top - np.maximum(pos_low, FIRST) + 1, 0),
        np.where(neg, neg_top - np.maximum(neg_low, FIRST) + 1, 0)
    ])
    need = np.minimum(need, buckets.max_buckets)
    budget = max(buckets.max_total - 3 * len(low), 0)
    grant = _grant(need, budget)
    pos_count, neg_count = grant[:len(low)], grant[len(low):]
    sizes = neg_count + 3 + pos_count
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return neg_top, neg_count, pos_top - pos_count + 1, pos_count, offsets


class SketchSum:
    """The ``extra`` of :meth:`NameTable.sync_with`: this rank's sketches
    as one dense block, and the summed block back as sketches.

    Args:
        pending (dict[str, Sketch]): This rank's sketches by name.
        buckets (LogBuckets): The layout. Defaults to ``DEFAULT_BUCKETS``.

    Example:
        >>> import numpy as np, torch
        >>> from mmstats.stats.sketch import bucket_counts
        >>> sketch = bucket_counts(torch.tensor([1., 2., 4.]))
        >>> extra = SketchSum({'x': sketch})
        >>> block = extra(['x'], np.array([1.]), np.array([4.]))  # this rank's
        >>> summed = extra.unpack(block, ['x'])  # one rank: its own block
        >>> summed[0].total, summed[0].codes.tolist() == sketch.codes.tolist()
        (3.0, True)
    """

    def __init__(self,
                 pending: Dict[str, Sketch],
                 buckets: LogBuckets = DEFAULT_BUCKETS) -> None:
        self.pending = pending
        self.buckets = buckets
        self.names: List[str] = []
        self.layout: Optional[tuple] = None

    def __call__(self, names: List[str], low: np.ndarray,
                 high: np.ndarray) -> np.ndarray:
        """This rank's ``(size, )`` block for the agreed table ``names``."""
        self.names = list(names)
        self.layout = neg_top, neg_n, pos_bottom, pos_n, offsets = layout(
            np.asarray(low, np.float64), np.asarray(high, np.float64),
            self.buckets)
        rows, codes, counts = [], [], []
        for i, name in enumerate(self.names):
            sketch = self.pending.get(name)
            if sketch is not None and sketch.codes.size:
                rows.append(np.full(sketch.codes.size, i, np.int64))
                codes.append(sketch.codes)
                counts.append(sketch.counts)
        block = np.zeros(int(offsets[-1]))
        if not rows:
            return block
        row, code = np.concatenate(rows), np.concatenate(codes)
        mag = np.abs(code)
        start, nn = offsets[row], neg_n[row]
        # a magnitude above the top (one ulp of log away) joins the top
        top = np.where(code > 0, pos_bottom[row] + pos_n[row] - 1,
                       neg_top[row])
        mag = np.minimum(mag, top)
        bottom = np.where(code > 0, pos_bottom[row], neg_top[row] - nn + 1)
        kept = (mag >= FIRST) & (mag >= bottom)
        # collapsed (+-1 or below the kept range), then zero
        at = np.where(code < 0, start + nn, start + nn + 2)
        at = np.where(code == 0, start + nn + 1, at)
        at = np.where(kept & (code < 0), start + neg_top[row] - mag, at)
        at = np.where(kept & (code > 0), start + nn + 3 + mag - bottom, at)
        block += np.bincount(at, np.concatenate(counts), block.size)
        return block

    def unpack(self, summed: Optional[np.ndarray],
               table: List[str]) -> List[Sketch]:
        """The summed block as one :class:`Sketch` per name of ``table``
        (the names kept after this update; empty where none)."""
        found: Dict[str, Sketch] = {}
        width = self.buckets.max_buckets
        if summed is not None and self.layout is not None:
            neg_top, neg_n, pos_bottom, _, offsets = self.layout
            at = np.flatnonzero(summed)
            row = np.searchsorted(offsets, at, side='right') - 1
            local, nn = at - offsets[row], neg_n[row]
            code = np.where(local < nn, -(neg_top[row] - local),
                            pos_bottom[row] + local - nn - 3)
            code = np.where((local >= nn) & (local <= nn + 2),
                            local - nn - COLLAPSED, code)
            bounds = np.searchsorted(row, np.arange(len(self.names) + 1))
            for i in np.unique(row).tolist():
                part = slice(bounds[i], bounds[i + 1])
                found[self.names[i]] = Sketch(code[part], summed[at[part]],
                                              width, self.names[i])
        empty = self.buckets.empty
        return [found.get(name) or empty() for name in table]
