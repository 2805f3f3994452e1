# Copyright (c) mmstats contributors. All rights reserved.
"""Mergeable quantile sketch kernels (DDSketch, Masson et al., VLDB 2019).

With ``gamma = (1 + alpha) / (1 - alpha)`` and ``E[k]`` the float64 table
of ``gamma^k`` (:attr:`LogBuckets.edges`), bucket ``k`` holds the positive
values in ``(E[k-1], E[k]]`` and the negative ones in ``(-E[k], -E[k-1]]``
(magnitudes ``[E[k-1], E[k])``): every bucket is ``(lower, upper]`` in value
order, as TensorBoard reads a histogram. Keys are exact against the table
on every device (``log`` gives a key within one of it, one comparison with
the table fixes it), so a value on an edge or one ulp beside it has the
same key on the host, on CPU and on CUDA, and histograms write exactly the
edges values were counted with. The representative value
``2 gamma^k / (1 + gamma)`` is within ``alpha`` relative of every magnitude
in bucket ``k``. Every finite float64 magnitude has a key (subnormals
included: about 72k keys per sign at ``alpha = 0.01``); zero has its own
bucket. A :class:`Sketch` (the host form) stores only the buckets it saw,
as sorted signed *codes* (value order) and counts; sketches merge by adding
counts.

Per name and sign, at most ``max_buckets`` keys below the largest magnitude
are kept: smaller non-zero magnitudes are *collapsed* (DDSketch's
collapsing-lowest store) into codes ``-1`` / ``+1``, counted, never given a
value: a quantile among them is NaN, with a warning. Which values collapse
depends only on the merged data, never on how it was split. NaN / inf are
not counted. See ``docs/quantiles.md``; the exchange across ranks is in
:mod:`.sketch_sum`.
"""
import math
import sys
import warnings
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

__all__ = [
    'ZERO', 'COLLAPSED', 'FIRST', 'LogBuckets', 'Sketch', 'DeviceWindow',
    'DEFAULT_BUCKETS', 'bucket_counts', 'group_bucket_counts', 'quantiles',
    'clamped_quantiles'
]

_F64 = torch.float64
# ``ceil(log(m) / log(gamma) - _BIAS)`` is the exact key or the one below
# (log's and the table's rounding move a key by ~1e-11, far below _BIAS):
# one comparison with the table's edge gives the exact key.
_BIAS = 1e-6
_MIN_NORMAL = 2.0**-1022

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

    Example:
        >>> import numpy as np
        >>> codes = np.array([5000, 5000, 3])  # 3: over 100 keys below 5000
        >>> sketch = Sketch.merged(codes, np.ones(3), width=100)
        >>> sketch.codes.tolist(), sketch.total, sketch.collapsed
        ([1, 5000], 3.0, 1.0)
        >>> sketch += Sketch(np.array([5000]), np.array([2.]), width=100)
        >>> sketch.counts.tolist()  # merged by adding counts
        [1.0, 4.0]
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


class DeviceWindow:
    """Counts of values on their device, per sign relative to an anchor.

    ``counts`` is ``(2 W + 4, )`` float64 in value order: ``[negative
    (W + 1) | zero | positive (W + 1) | non-finite]``; the ``j``-th slot
    from zero of a sign holds key ``anchor - j`` (``j < W``) or the
    collapsed magnitudes (``j = W``). ``anchors`` is ``(2, )`` float64: the
    largest key of the positive and of the negative values.

    Example:
        >>> import torch
        >>> values = torch.tensor([1., -2., 0., float('nan')])
        >>> window = DEFAULT_BUCKETS.bucket_counts(values)  # a DeviceWindow
        >>> window.device, window.counts.shape, window.counts[-1].item()
        (device(type='cpu'), torch.Size([4100]), 1.0)
        >>> DEFAULT_BUCKETS.window_sketch(window).total  # the NaN: not counted
        3.0
    """
    __slots__ = ('anchors', 'counts')

    def __init__(self, anchors: torch.Tensor, counts: torch.Tensor) -> None:
        self.anchors, self.counts = anchors, counts

    @property
    def device(self) -> torch.device:
        return self.counts.device


class LogBuckets:
    """The bucket layout of sketches: relative accuracy and bounds.

    Args:
        relative_accuracy (float): ``alpha``: every quantile is within
            ``alpha`` relative of a true value of that rank. Defaults to
            0.01.
        max_buckets (int): Buckets kept per name and sign below its largest
            magnitude (2048 at 1%: 17.8 decades); smaller magnitudes are
            collapsed and counted. Defaults to 2048.
        max_total (int): Float64 buckets one update sends per rank, all names
            together (8 MB); beyond, each name keeps fewer buckets. Defaults
            to 2**20.

    Example:
        >>> import torch
        >>> buckets = LogBuckets(relative_accuracy=0.05, max_buckets=64)
        >>> sketch = bucket_counts(torch.arange(1., 101.), buckets)
        >>> round(float(buckets.quantiles(sketch, 0.5)), 2)  # 50, within 5%
        52.04
    """

    def __init__(self,
                 relative_accuracy: float = 0.01,
                 max_buckets: int = 2048,
                 max_total: int = 2**20) -> None:
        if not 0 < relative_accuracy < 1:
            raise ValueError('LogBuckets: relative_accuracy must be in (0, 1)'
                             f', e.g. 0.01, got {relative_accuracy!r}')
        for arg, value in (('max_buckets', max_buckets), ('max_total',
                                                          max_total)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f'LogBuckets: {arg} must be a positive int,'
                                 f' got {value!r}')
        self.relative_accuracy = float(relative_accuracy)
        self.max_buckets, self.max_total = max_buckets, max_total
        mantissa = 2 * relative_accuracy / (1 - relative_accuracy)
        self.gamma = 1 + mantissa
        # 1 / ln(gamma), as in the ddsketch package's key mapping
        self.multiplier = 1 / math.log1p(mantissa)
        self.min_key = math.ceil(math.log(5e-324) * self.multiplier)
        self.max_key = math.ceil(
            math.log(sys.float_info.max) * self.multiplier)
        self._log_scale = math.log(2 / (1 + self.gamma))
        self._edges: Optional[np.ndarray] = None
        self._device_edges: dict = {}  # device -> the edges there

    def __getstate__(self) -> dict:
        """Pickled without the edge tables (rebuilt at first use)."""
        state = self.__dict__.copy()
        state['_edges'], state['_device_edges'] = None, {}
        return state

    def __repr__(self) -> str:
        return (f'LogBuckets(relative_accuracy={self.relative_accuracy}, '
                f'max_buckets={self.max_buckets}, '
                f'max_total={self.max_total})')

    def _params(self) -> tuple:
        return self.relative_accuracy, self.max_buckets, self.max_total

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogBuckets):
            return NotImplemented
        return self._params() == other._params()

    def __hash__(self) -> int:
        return hash(self._params())

    @property
    def edges(self) -> np.ndarray:
        """The float64 bucket edges, ``(2, max_key - min_key + 2)``: row 0
        ``E[k]`` of the positive values, row 1 of the negative ones'
        magnitudes, for the keys ``min_key - 1 .. max_key`` (``E[k]`` at
        column ``k - min_key + 1``); built at first use (16 bytes per key:
        1.2 MB at 1%).

        ``E[k]`` is ``exp(k ln gamma)``. Below the smallest normal float,
        where the subnormal grid is coarser than a bucket, it is rounded to
        the grid away from the bucket's values (down for the positive
        ``(E[k-1], E[k]]``, up for the negative magnitudes ``[E[k-1],
        E[k])``): a bucket holds only magnitudes within
        ``[gamma^(k-1), gamma^k]``, and ``log`` stays within one key of
        the table. ``E[max_key]`` is inf: the top bucket reaches to the
        largest float.

        Example:
            >>> edges = DEFAULT_BUCKETS.edges
            >>> edges[:, -DEFAULT_BUCKETS.min_key + 1].tolist()  # E[0]
            [1.0, 1.0]
            >>> bool((edges[:, 1:] >= edges[:, :-1]).all())
            True
        """
        if self._edges is None:
            keys = np.arange(
                self.min_key - 1, self.max_key + 1, dtype=np.float64)
            with np.errstate(over='ignore'):
                edges = np.exp(np.stack([keys, keys]) / self.multiplier)
            low = edges[0] < _MIN_NORMAL
            grid = np.exp(keys[low] / self.multiplier + 1074 * math.log(2))
            edges[0, low] = np.ldexp(np.floor(grid), -1074)
            edges[1, low] = np.ldexp(np.ceil(grid), -1074)
            edges[:, -1] = np.inf
            self._edges = edges
        return self._edges

    def _table(self, device: Optional[torch.device] = None):
        """The edges keys are compared with (``magnitude > table[column +
        sign * size]``): the positive edges, then the largest float below
        each negative edge (``>`` there is ``>=`` the edge); a numpy array,
        or a tensor on ``device`` (copied there once, asynchronously from
        pinned memory on CUDA)."""
        table = self._device_edges.get(device)
        if table is None:
            table = np.concatenate(
                [self.edges[0], np.nextafter(self.edges[1], 0.)])
            if device is not None:
                host = torch.from_numpy(table)
                if device.type == 'cuda':
                    host = host.pin_memory()  # kept alive with the copy
                    self._device_edges[(device, 'pinned')] = host
                table = host.to(device, non_blocking=True)
            self._device_edges[device] = table
        return table

    def codes(self, values: np.ndarray) -> np.ndarray:
        """Signed codes of finite float64 ``values`` (0 for zero), exact
        against :attr:`edges` (the host twin of :meth:`bucket_counts`).

        Example:
            >>> import numpy as np
            >>> codes = DEFAULT_BUCKETS.codes(np.array([-1., 1., 2., 0.]))
            >>> np.sign(codes).tolist()  # zero: code 0
            [-1, 1, 1, 0]
            >>> (np.abs(codes[:3]) + DEFAULT_BUCKETS.min_key - 2).tolist()
            [1, 0, 35]
        """
        x = np.asarray(values, dtype=np.float64)
        mag = np.abs(x)
        with np.errstate(divide='ignore'):
            keys = np.ceil(np.log(mag) * self.multiplier - _BIAS)
        keys = np.clip(keys, self.min_key, self.max_key)
        column = (keys - (self.min_key - 1)).astype(np.int64)
        column += (x < 0) * self.edges.shape[1]
        keys += mag > self._table()[column]
        codes = keys.astype(np.int64) - (self.min_key - FIRST)
        return np.sign(x).astype(np.int64) * codes

    def _device_keys(self,
                     x: torch.Tensor,
                     sign: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Keys of the finite float64 tensor ``x`` (of sign ``sign``) as
        :meth:`codes` gives them, on ``x``'s device, without a sync (any
        key for zero). Float ops only: adding a bool tensor is several
        times slower on CPU."""
        sign = x.sign() if sign is None else sign
        mag = x.abs()
        keys = mag.log().mul_(self.multiplier).sub_(_BIAS).ceil_().clamp_(
            self.min_key, self.max_key)
        # the positive edges' column, or the negative ones' (size after)
        half = self.edges.shape[1] / 2
        column = keys.add(half - (self.min_key - 1)).sub_(sign, alpha=half)
        edge = self._table(x.device).index_select(0, column.long())
        # keys + 1 where mag > edge
        return keys.sub_(edge.sub_(mag).sign_().clamp_(max=0))

    def _keys(self, codes: np.ndarray) -> np.ndarray:
        """The bucket keys ``k`` of signed codes (as float64)."""
        return (np.abs(codes) - FIRST + self.min_key).astype(np.float64)

    def magnitude_bounds(self,
                         codes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The magnitudes ``E[k-1]`` and ``E[k]`` (at most the largest
        float64) between which each kept signed code counts: positive
        values in ``(E[k-1], E[k]]``, negative ones in ``(-E[k],
        -E[k-1]]`` (:attr:`edges`)."""
        column = self._keys(codes).astype(np.int64) - (self.min_key - 1)
        row = (np.asarray(codes) < 0).astype(np.int64)
        edges = self.edges
        return edges[row, column - 1], np.minimum(edges[row, column],
                                                  sys.float_info.max)

    def representatives(self, codes: np.ndarray) -> np.ndarray:
        """Values of signed codes (NaN for collapsed codes)."""
        mags = np.abs(codes)
        keys = self._keys(codes)
        with np.errstate(over='ignore'):
            out = np.minimum(
                np.exp(keys / self.multiplier + self._log_scale),
                sys.float_info.max)
        out = np.where(mags == COLLAPSED, np.nan, out)
        return np.where(mags == ZERO, 0., np.sign(codes) * out)

    # -- counting ----------------------------------------------------------
    def bucket_counts(self, values: torch.Tensor) -> Optional['DeviceWindow']:
        """Counts of ``values`` on their device, without a host sync (None
        for no values).

        Elementwise float64 ops (no boolean masks: slow on CPU), one
        ``aminmax`` for the anchors and a fixed-size histogram:
        ``torch.histc`` on CUDA, ``index_add_`` on CPU and under
        ``torch.use_deterministic_algorithms``.
        """
        x = values.detach().reshape(-1).to(_F64)
        if x.numel() == 0:
            return None
        width, center = self.max_buckets, self.max_buckets + 1
        finite = x.nan_to_num(0., 0., 0.)
        sign = finite.sign()
        key = self._device_keys(finite, sign)
        # anchors: keys of the largest finite magnitude of each sign
        low, high = torch.aminmax(finite)
        signed = torch.stack([high, low])
        anchors = torch.where(
            torch.stack([high, -low]) > 0, self._device_keys(signed),
            torch.full_like(signed, self.min_key))
        half = (anchors[0] - anchors[1]) / 2  # exact: integers < 2^53
        # slot = center + sign (1 + min(anchor of the sign - key, W));
        # zero: sign 0; NaN / inf: x * 0 is NaN -> the spare last slot
        offset = sign.mul(half).add_(anchors.mean()).sub_(key).clamp_(
            max=width).add_(1.)
        index = torch.addcmul(x * 0. + center, sign,
                              offset).nan_to_num_(2. * width + 3)
        size = 2 * width + 4
        if x.is_cuda and not torch.are_deterministic_algorithms_enabled():
            # per-block shared-memory histogram: index_add_'s global atomics
            # serialise on a popular bucket (zeros of a ReLU: 12x slower)
            return DeviceWindow(anchors,
                                torch.histc(index, size, -0.5, size - 0.5))
        counts = torch.zeros(size, dtype=_F64, device=x.device)
        ones = torch.ones(1, dtype=_F64, device=x.device).expand(x.numel())
        counts.index_add_(0, index.long(), ones)
        return DeviceWindow(anchors, counts)

    def merge_windows(self, a: DeviceWindow, b: DeviceWindow) -> DeviceWindow:
        """One window of both (re-anchored at the larger keys; no sync)."""
        width = self.max_buckets
        anchors = torch.maximum(a.anchors, b.anchors)
        out = torch.zeros_like(a.counts)
        ramp = torch.arange(width + 1, dtype=_F64, device=out.device)
        fixed = torch.tensor([width + 1., 2 * width + 3],
                             dtype=_F64,
                             device=out.device)
        for w in (a, b):
            shift = anchors - w.anchors
            index = torch.cat([
                width - (ramp.flip(0) + shift[1]).clamp_(max=width), fixed[:1],
                (ramp + shift[0]).clamp_(max=width) + (width + 2), fixed[1:]
            ])
            out.index_add_(0, index.long(), w.counts)
        return DeviceWindow(anchors, out)

    def window_sketch(self, window: DeviceWindow) -> Sketch:
        """The host :class:`Sketch` of a window (one copy to the host)."""
        width, center = self.max_buckets, self.max_buckets + 1
        counts = window.counts.cpu().numpy()[:-1]  # non-finite dropped
        anchors = window.anchors.cpu().numpy().astype(np.int64)
        slots = np.flatnonzero(counts)
        sign = np.sign(slots - center)
        j = np.abs(slots - center) - 1  # keys below the anchor of the sign
        mags = anchors[(sign < 0).astype(np.int64)] - j - (
            self.min_key - FIRST)
        codes = sign * np.where(j == width, COLLAPSED, mags)
        return Sketch.merged(codes, counts[slots], width)

    def group_bucket_counts(self, x: np.ndarray, seg: np.ndarray,
                            groups: int) -> List[Sketch]:
        """Sketches of host float64 values ``x``, one per group ``seg`` in
        ``[0, groups)`` (one ``np.unique`` for all)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        seg = np.asarray(seg, dtype=np.int64).reshape(-1)
        finite = np.isfinite(x)
        if not finite.all():
            x, seg = x[finite], seg[finite]
        codes = self.codes(x)
        span = self.max_key - self.min_key + FIRST + 1  # |code| < span
        flat, counts = np.unique(
            seg * (2 * span) + codes + span, return_counts=True)
        group = flat // (2 * span)
        bounds = np.searchsorted(group, np.arange(groups + 1))
        codes = flat - group * (2 * span) - span
        counts = counts.astype(np.float64)
        out = []
        for g in range(groups):
            sketch = Sketch(codes[bounds[g]:bounds[g + 1]],
                            counts[bounds[g]:bounds[g + 1]], self.max_buckets)
            sketch._collapse()
            out.append(sketch)
        return out

    def empty(self) -> Sketch:
        return Sketch(
            np.zeros(0, np.int64), np.zeros(0, np.float64), self.max_buckets)

    # -- querying ----------------------------------------------------------
    def quantiles(self, sketch: Sketch,
                  qs: Union[float, Sequence[float]]) -> np.ndarray:
        """Quantiles of a sketch, DDSketch's lower-rank convention.

        For ``q`` and ``n`` counted values, the representative of the bucket
        holding the value of 0-based rank ``floor(q (n - 1))`` (numpy's
        ``method='lower'``): within ``relative_accuracy`` of it (exactly 0
        for 0). NaN for an empty sketch and where that value was collapsed.

        Returns:
            np.ndarray: One value per ``q`` (0-d for a scalar ``qs``).
        """
        q = np.asarray(qs, dtype=np.float64)
        if q.size and not ((q >= 0) & (q <= 1)).all():
            raise ValueError(f'quantiles: qs must be in [0, 1], got {qs!r}')
        if not sketch.codes.size:
            return np.full(q.shape, np.nan)
        cum = np.cumsum(sketch.counts)
        rank = np.floor(q.reshape(-1) * max(cum[-1] - 1, 0))
        index = np.minimum(
            np.searchsorted(cum, rank, side='right'), cum.size - 1)
        return self.representatives(sketch.codes[index]).reshape(q.shape)


DEFAULT_BUCKETS = LogBuckets()


def bucket_counts(values: torch.Tensor,
                  buckets: LogBuckets = DEFAULT_BUCKETS) -> Sketch:
    """Host :class:`Sketch` of a tensor (syncs; tests and tools).

    Example:
        >>> import torch
        >>> sketch = bucket_counts(torch.tensor([1., 2., 3., 4.]))
        >>> sketch.total, len(sketch.codes)  # one bucket per value here
        (4.0, 4)
    """
    window = buckets.bucket_counts(values)
    return buckets.empty() if window is None else buckets.window_sketch(window)


def group_bucket_counts(x: np.ndarray,
                        seg: np.ndarray,
                        groups: int,
                        buckets: LogBuckets = DEFAULT_BUCKETS) -> List[Sketch]:
    """Per-group sketches of host values (see
    :meth:`LogBuckets.group_bucket_counts`).

    Example:
        >>> import numpy as np
        >>> x, seg = np.array([1., 2., 0.]), np.array([0, 0, 1])
        >>> [sketch.total for sketch in group_bucket_counts(x, seg, groups=3)]
        [2.0, 1.0, 0.0]
    """
    return buckets.group_bucket_counts(x, seg, groups)


def quantiles(sketch: Sketch,
              qs: Union[float, Sequence[float]],
              buckets: LogBuckets = DEFAULT_BUCKETS) -> np.ndarray:
    """Quantiles of a sketch (see :meth:`LogBuckets.quantiles`).

    Example:
        >>> import torch
        >>> sketch = bucket_counts(torch.tensor([1., 2., 3., 4.]))
        >>> quantiles(sketch, [0., 0.5, 1.]).round(2).tolist()  # within 1%
        [0.99, 1.99, 4.01]
    """
    return buckets.quantiles(sketch, qs)


def clamped_quantiles(sketch: Sketch,
                      qs: np.ndarray,
                      low: float,
                      high: float,
                      buckets: LogBuckets = DEFAULT_BUCKETS) -> np.ndarray:
    """Quantiles ``qs`` of a sketch whose exact extremes are ``low`` and
    ``high``: clamped into them (never less accurate), exact at 0 and 1;
    NaN with a warning where the value of that rank was collapsed.

    Example:
        >>> import numpy as np, torch
        >>> sketch = bucket_counts(torch.tensor([1., 2., 3., 4.]))
        >>> qs = np.array([0., 0.5, 1.])
        >>> clamped_quantiles(sketch, qs, low=1., high=4.).round(2).tolist()
        [1.0, 1.99, 4.0]
    """
    raw = buckets.quantiles(sketch, qs)
    out = np.clip(raw, low, high)
    out = np.where(qs == 0, low, np.where(qs == 1, high, out))
    lost = np.isnan(out) & (sketch.total > 0)
    if lost.any():
        warnings.warn(
            f'quantile sketch{f" of {sketch.name!r}" if sketch.name else ""}'
            f': q={np.atleast_1d(qs)[np.atleast_1d(lost)].tolist()} fall '
            'among values whose magnitudes were collapsed (more than '
            'max_buckets buckets below the largest magnitude of their sign,'
            ' or beyond the per-update budget max_total): NaN instead (see '
            'docs/quantiles.md)')
    return out
