# Copyright (c) mmstats contributors. All rights reserved.
"""BNRecorder: routes BN layers' batch statistics into flat buffers.

While installed, every participating BN layer runs with ``momentum=1`` and
running buffers that are aligned views of one flat ``(2, channels +
padding)`` tensor per (device, dtype) group, so after a forward the flat
tensor holds every layer's batch mean and unbiased batch variance.
:meth:`BNRecorder.accumulate` folds them into float64 sums with a few flat
ops per group; everything is restored by :meth:`BNRecorder.restore`.
"""
from typing import Callable, Dict, List, Tuple, Type

import torch
from torch import Tensor
from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm

from .estimators import Estimator

_F64 = torch.float64
# Alignment of each layer's running-buffer view in the flat buffers.
ALIGN_BYTES = 256


class LayerGroup:
    """BN layers whose buffers share one (device, dtype): flat buffers.

    Example:
        >>> from torch import nn
        >>> group = LayerGroup([nn.BatchNorm1d(3), nn.BatchNorm1d(5)], 0)
        >>> group.count, group.sizes
        (2, [3, 5])
    """

    def __init__(self, layers: List[_BatchNorm], first: int) -> None:
        buf = layers[0].running_mean
        self.device, self.dtype = buf.device, buf.dtype
        self.first, self.count = first, len(layers)
        self.sizes = [bn.running_mean.numel() for bn in layers]
        channels = sum(self.sizes)
        # row 0: the layers' batch means, row 1: their unbiased batch vars;
        # each layer's view starts on an ALIGN_BYTES boundary (CUDA BN
        # kernels, e.g. channels_last, load running buffers vectorised:
        # unaligned views fail with "misaligned address")
        align = max(1, ALIGN_BYTES // buf.element_size())
        self.starts, width = [], 0
        for size in self.sizes:
            self.starts.append(width)
            width += -(-size // align) * align
        self.flat = torch.zeros(2, width, dtype=self.dtype, device=self.device)
        self.views = [(self.flat[0, s:s + n], self.flat[1, s:s + n])
                      for s, n in zip(self.starts, self.sizes)]
        self.packed_index = torch.cat([
            torch.arange(s, s + n) for s, n in zip(self.starts, self.sizes)
        ]).to(self.device)
        self.channel_layer = torch.repeat_interleave(
            torch.arange(self.count), torch.tensor(self.sizes)).to(self.device)
        # raw sums of [mu_b, v_b] and of mu_b^2 over batches of equal counts
        self.raw = torch.zeros(2, channels, dtype=_F64, device=self.device)
        self.raw_squares = torch.zeros(
            channels, dtype=_F64, device=self.device)
        # weighted sums: [mean sum, var sum (+ n mu^2)], weights per layer
        self.sums = torch.zeros(2, channels, dtype=_F64, device=self.device)
        self.weights = torch.zeros(
            2, self.count, dtype=_F64, device=self.device)

    def packed(self) -> Tensor:
        """``flat`` without the alignment padding: ``(2, channels)``."""
        return self.flat.index_select(1, self.packed_index)


class BNRecorder:
    """Installs per-layer forward wrappers and flat buffers; undoes it.

    Args:
        layers (list[_BatchNorm]): The participating BN layers.
        estimator (type[Estimator]): How batch statistics combine.

    Example:
        >>> from torch import nn
        >>> from mmstats.precise_bn import PopulationEstimator
        >>> bns = [nn.BatchNorm1d(3), nn.BatchNorm1d(5)]
        >>> recorder = BNRecorder(bns, PopulationEstimator)
        >>> len(recorder.groups), recorder.counts  # one (device, dtype)
        (1, [0, 0])
    """

    def __init__(self, layers: List[_BatchNorm],
                 estimator: Type[Estimator]) -> None:
        self.estimator = estimator
        keyed: Dict[Tuple[str, str], List[_BatchNorm]] = {}
        for bn in layers:
            buf = bn.running_mean
            keyed.setdefault((str(buf.device), str(buf.dtype)), []).append(bn)
        self.layers: List[_BatchNorm] = []
        self.groups: List[LayerGroup] = []
        for key in sorted(keyed):
            self.groups.append(LayerGroup(keyed[key], len(self.layers)))
            self.layers += keyed[key]
        self.counts = [0] * len(self.layers)  # values per channel, per call
        self._zeros = [0] * len(self.layers)
        self._signature: List[int] = []  # counts of the raw batches
        self._raw_batches = 0
        self._saved: List[dict] = []

    def _locate(self, i: int) -> Tuple[LayerGroup, int]:
        for group in self.groups:
            if i < group.first + group.count:
                return group, i - group.first
        raise IndexError(i)

    # -- install / restore ------------------------------------------------
    def install(self) -> None:
        for i, bn in enumerate(self.layers):
            group, j = self._locate(i)
            buffers = bn._buffers
            saved = dict(
                bn=bn,
                momentum=bn.momentum,
                running_mean=buffers['running_mean'],
                running_var=buffers['running_var'],
                num_batches_tracked=buffers.get('num_batches_tracked'),
                forward=bn.__dict__.get('forward'),
                nbt_value=None)
            self._saved.append(saved)
            inner = saved['forward'] or self._class_forward(bn)
            nbt = saved['num_batches_tracked']
            if nbt is not None:
                if saved['forward'] is None and \
                        inner.__func__ is _BatchNorm.forward:
                    buffers['num_batches_tracked'] = None  # skips add_(1)
                else:
                    saved['nbt_value'] = nbt.clone()
            bn.momentum = 1.0  # running stats := this batch's statistics
            buffers['running_mean'], buffers['running_var'] = group.views[j]
            bn.__dict__['forward'] = self._make_forward(i, inner)

    @staticmethod
    def _class_forward(bn: _BatchNorm) -> Callable:
        if isinstance(bn, SyncBatchNorm) and \
                type(bn).forward is SyncBatchNorm.forward:
            # local statistics: no collective inside forwards; the ranks'
            # statistics are combined exactly at the end
            return _BatchNorm.forward.__get__(bn)
        return type(bn).forward.__get__(bn)

    def restore(self) -> None:
        for saved in reversed(self._saved):
            bn, buffers = saved['bn'], saved['bn']._buffers
            if saved['forward'] is not None:
                bn.__dict__['forward'] = saved['forward']
            else:
                bn.__dict__.pop('forward', None)
            buffers['running_mean'] = saved['running_mean']
            buffers['running_var'] = saved['running_var']
            buffers['num_batches_tracked'] = saved['num_batches_tracked']
            if saved['nbt_value'] is not None:
                saved['num_batches_tracked'].copy_(saved['nbt_value'])
            bn.momentum = saved['momentum']
        self._saved = []

    # -- per forward --------------------------------------------------------
    def _make_forward(self, i: int, inner: Callable) -> Callable:
        counts = self.counts
        fold_call = self._fold_call

        def forward(input: Tensor, *args, **kwargs):
            if counts[i]:  # second call in one forward (shared layer)
                fold_call(i)
            counts[i] = input.numel() // (
                input.shape[1] if input.dim() > 1 else 1)
            return inner(input, *args, **kwargs)

        return forward

    def _fold_call(self, i: int) -> None:
        """Add layer ``i``'s statistics of its previous call now."""
        group, j = self._locate(i)
        start = sum(group.sizes[:j])
        part = slice(start, start + group.sizes[j])
        w_mean, w_var = self.estimator.weights(self.counts[i])
        first = group.starts[j]
        stats = group.flat[:, first:first + group.sizes[j]].double()
        group.sums[0, part] += w_mean * stats[0]
        group.sums[1, part] += w_var * stats[1]
        if self.estimator.needs_squares:
            group.sums[1, part] += w_mean * stats[0] * stats[0]
        group.weights[0, j] += w_mean
        group.weights[1, j] += w_var
        self.counts[i] = 0

    def accumulate(self) -> None:
        """Add the statistics of the last forward.

        Batches with the same per-layer counts (all but the last, usually)
        are summed raw, two flat ops per group and no host-device sync; the
        weights are applied once per run of equal counts (:meth:`fold`).
        """
        counts = self.counts
        if counts != self._signature:
            self.fold()
            self._signature = list(counts)
        squares = self.estimator.needs_squares
        for group in self.groups:
            stats = group.packed()
            group.raw.add_(stats)
            if squares:
                mean = stats[0]
                group.raw_squares.addcmul_(mean, mean)
        self._raw_batches += 1
        counts[:] = self._zeros

    def fold(self) -> None:
        """Weight and add the raw sums of the current run of batches."""
        if not self._raw_batches:
            return
        weights = [self.estimator.weights(n) for n in self._signature]
        for group in self.groups:
            pairs = weights[group.first:group.first + group.count]
            w = torch.tensor(pairs, dtype=_F64).t().to(group.device)
            group.weights.add_(w, alpha=self._raw_batches)
            w_chan = w[:, group.channel_layer]
            group.sums.addcmul_(w_chan, group.raw)
            if self.estimator.needs_squares:
                group.sums[1].addcmul_(w_chan[0], group.raw_squares)
            group.raw.zero_()
            group.raw_squares.zero_()
        self._raw_batches = 0

    def statistics(self, group: LayerGroup) -> Tuple[Tensor, Tensor]:
        """Per-channel float64 mean and variance of ``group`` (after
        :meth:`fold` and the cross-rank reduction of ``sums``/``weights``)."""
        chan = group.channel_layer
        return self.estimator.finalize(group.sums[0], group.sums[1],
                                       group.weights[0][chan],
                                       group.weights[1][chan])
