# Copyright (c) mmstats contributors. All rights reserved.
"""The host form of a quantile sketch: only the buckets seen, as sorted
signed codes and their counts (kernels in :mod:`.sketch`)."""
from typing import Optional

import numpy as np

__all__ = ['Sketch', 'ZERO', 'COLLAPSED', 'FIRST']

# Signed codes: 0 is zero, +-1 collapsed magnitudes, +-(key - min_key + 2)
# kept buckets: codes sort as the values they stand for.
ZERO, COLLAPSED, FIRST = 0, 1, 2


class Sketch:
    """Sparse bucket counts: sorted unique ``codes`` and their ``counts``.

    Args:
        codes (np.ndarray): int64 signed codes, sorted, unique.
        counts (np.ndarray): float64 counts (exact integers).
        width (int): Keys kept per sign below its largest magnitude.
        name (str, optional): For warnings. Defaults to None.
    """
    __slots__ = ('codes', 'counts', 'width', 'name')

    def __init__(self,
                 codes: np.ndarray,
                 counts: np.ndarray,
                 width: int,
                 name: Optional[str] = None) -> None:
        self.codes, self.counts, self.width = codes, counts, width
        self.name = name

    def __getstate__(self) -> tuple:
        return self.codes, self.counts, self.width, self.name

    def __setstate__(self, state: tuple) -> None:
        self.codes, self.counts, self.width, self.name = state

    @classmethod
    def merged(cls, codes: np.ndarray, counts: np.ndarray,
               width: int) -> 'Sketch':
        """A sketch of unsorted, repeated ``codes``, collapsed to
        ``width``."""
        uniq, inverse = np.unique(codes, return_inverse=True)
        sketch = cls(uniq, np.bincount(inverse, counts, len(uniq)), width)
        sketch._collapse()
        return sketch

    def _collapse(self) -> None:
        codes = self.codes
        if not codes.size:
            return
        pos = np.searchsorted(codes, FIRST)
        neg = np.searchsorted(codes, -COLLAPSED)  # codes <= -FIRST before
        if ((pos == codes.size or codes[-1] - codes[pos] < self.width)
                and (neg == 0 or codes[neg - 1] - codes[0] < self.width)):
            return
        mags = np.abs(codes)
        top = np.where(codes > 0, codes[-1], -codes[0])
        low = (mags >= FIRST) & (mags <= top - self.width)
        codes = np.where(low, np.sign(codes) * COLLAPSED, codes)
        merged = Sketch.merged(codes, self.counts, self.width)
        self.codes, self.counts = merged.codes, merged.counts

    def copy(self) -> 'Sketch':
        return Sketch(self.codes.copy(), self.counts.copy(), self.width,
                      self.name)

    def __iadd__(self, other: 'Sketch') -> 'Sketch':
        if np.array_equal(self.codes, other.codes):
            self.counts = self.counts + other.counts
            return self
        merged = Sketch.merged(
            np.concatenate([self.codes, other.codes]),
            np.concatenate([self.counts, other.counts]), self.width)
        self.codes, self.counts = merged.codes, merged.counts
        return self

    @property
    def total(self) -> float:
        """Number of values counted (collapsed ones included)."""
        return float(self.counts.sum())

    @property
    def collapsed(self) -> float:
        """Number of non-zero values whose magnitude was collapsed."""
        return float(self.counts[np.abs(self.codes) == COLLAPSED].sum())

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.counts.nbytes
