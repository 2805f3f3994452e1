# Copyright (c) mmstats contributors. All rights reserved.
"""Precise BatchNorm: recompute BN running statistics with frozen weights.

"Rethinking 'Batch' in BatchNorm" (Wu & Johnson, 2021): the EMA of batch
statistics kept by BatchNorm during training lags behind the weights; the
population statistics of a few thousand samples under the *current* weights
are a better estimate for inference. :func:`update_bn_stats` computes them.
"""
import logging
import math
import random
import sys
import time
from contextlib import contextmanager, nullcontext
from typing import (Any, Callable, ContextManager, Dict, Iterable, Iterator,
                    List, Optional, Tuple)

import numpy as np
import torch
from mmengine.logging import print_log
from mmengine.model import BaseModel, is_model_wrapper
from mmengine.utils import ProgressBar
from torch import Tensor, nn
from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from mmstats.dist import get_rank, get_world_size, scaled_all_reduce

__all__ = ['ESTIMATORS', 'update_bn_stats', 'preserve_rng_state']

ESTIMATORS = ('population', 'batch_average')

_OTHER_NORMS = (nn.GroupNorm, _InstanceNorm, nn.LayerNorm,
                nn.LocalResponseNorm)
_RMS_NORM = getattr(nn, 'RMSNorm', None)
if _RMS_NORM is not None:
    _OTHER_NORMS = _OTHER_NORMS + (_RMS_NORM, )


@contextmanager
def preserve_rng_state() -> Iterator[None]:
    """Save the global RNG states and restore them on exit.

    Covers python ``random``, numpy's global ``RandomState``, torch's CPU
    generator and, if CUDA is initialised, the generators of all CUDA
    devices. Random draws inside the block (dropout, augmentation, a
    loader's base seed) do not shift the random stream outside of it.
    """
    py_state = random.getstate()
    np_state = np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_states = torch.cuda.get_rng_state_all()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def _unwrap(model: nn.Module) -> nn.Module:
    """Strip DDP / mmengine model wrappers (no collectives in forwards)."""
    while is_model_wrapper(model) or isinstance(
            model, (nn.parallel.DistributedDataParallel,
                    nn.DataParallel)):
        model = model.module
    return model


def _num_samples(inputs: Any) -> int:
    """Samples in a batch: first dim of a tensor or length of a list."""
    if isinstance(inputs, Tensor):
        return int(inputs.shape[0]) if inputs.dim() > 0 else 1
    if isinstance(inputs, (list, tuple)):
        return len(inputs)
    if isinstance(inputs, dict) and inputs:
        return _num_samples(inputs.get('inputs', next(iter(inputs.values()))))
    raise TypeError('update_bn_stats cannot count the samples of a batch of '
                    f'type {type(inputs).__name__}: a batch must be a tensor, '
                    'a tuple/list whose first item is the input, or a dict')


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(d, device) for d in data)
    if isinstance(data, dict):
        return {k: _to_device(v, device) for k, v in data.items()}
    return data


def _forward(model: nn.Module, batch: Any,
             device: Optional[torch.device]) -> int:
    """Run one forward on ``batch``; return its number of samples."""
    if isinstance(model, BaseModel):
        data = model.data_preprocessor(batch, False)
        if isinstance(data, dict):
            model(**data, mode='tensor')
            return _num_samples(data['inputs'] if 'inputs' in data else data)
        if isinstance(data, (list, tuple)):
            model(*data, mode='tensor')
            return _num_samples(data[0])
        raise TypeError('update_bn_stats: the data_preprocessor returned a '
                        f'{type(data).__name__}; expected a dict or tuple')
    if device is not None and device.type != 'cpu':
        batch = _to_device(batch, device)
    if isinstance(batch, Tensor):
        model(batch)
        return _num_samples(batch)
    if isinstance(batch, (list, tuple)) and batch:
        model(batch[0])
        return _num_samples(batch[0])
    if isinstance(batch, dict):
        model(**batch)
        return _num_samples(batch)
    raise TypeError('update_bn_stats: a batch for a plain nn.Module must be '
                    'a tensor, a non-empty tuple/list (the first item is fed '
                    f'to the model) or a dict of kwargs; got '
                    f'{type(batch).__name__}')


class _Group:
    """BN layers whose buffers share one (device, dtype)."""

    def __init__(self, layers: List[Tuple[str, _BatchNorm]], lo: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.lo, self.hi = lo, lo + len(layers)
        self.device, self.dtype = device, dtype
        sizes = [bn.running_mean.numel() for _, bn in layers]
        self.num_channels = sum(sizes)
        self.slices: List[slice] = []
        start = 0
        for size in sizes:
            self.slices.append(slice(start, start + size))
            start += size
        # row 0: the layers' batch means, row 1: their (unbiased) batch vars
        self.flat = torch.zeros(2, self.num_channels, dtype=dtype,
                                device=device)
        chan_layer = torch.repeat_interleave(
            torch.arange(len(layers)), torch.tensor(sizes))
        self.chan_layer = chan_layer.to(device)
        # gathers [w0 per channel, w1 per channel] out of [w0(L), w1(L)]
        self.index = torch.cat([chan_layer,
                                chan_layer + len(layers)]).to(device)
        # float64 accumulators: sums (per channel) and weights (per layer)
        self.acc = torch.zeros(2, self.num_channels, dtype=torch.float64,
                               device=device)
        self.weights = torch.zeros(2 * len(layers), dtype=torch.float64,
                                   device=device)


class _PreciseBNState:
    """Installs the per-layer forward wrappers and flat buffers; undoes it."""

    def __init__(self, layers: List[Tuple[str, _BatchNorm]],
                 population: bool) -> None:
        self.population = population
        keyed: Dict[Tuple[str, str], List[Tuple[str, _BatchNorm]]] = {}
        for name, bn in layers:
            buf = bn.running_mean
            keyed.setdefault((str(buf.device), str(buf.dtype)), []).append(
                (name, bn))
        self.layers: List[Tuple[str, _BatchNorm]] = []
        self.groups: List[_Group] = []
        self.layer_group: List[Tuple[_Group, int]] = []
        for key in sorted(keyed):
            members = keyed[key]
            buf = members[0][1].running_mean
            group = _Group(members, len(self.layers), buf.device, buf.dtype)
            self.groups.append(group)
            self.layer_group += [(group, j) for j in range(len(members))]
            self.layers += members
        self.counts = [0] * len(self.layers)
        self._zeros = [0] * len(self.layers)
        self._saved: List[dict] = []

    # -- install / restore ------------------------------------------------
    def install(self) -> None:
        for i, (_, bn) in enumerate(self.layers):
            group, j = self.layer_group[i]
            saved = dict(
                bn=bn,
                momentum=bn.momentum,
                running_mean=bn._buffers['running_mean'],
                running_var=bn._buffers['running_var'],
                num_batches_tracked=bn._buffers.get('num_batches_tracked'),
                has_forward='forward' in bn.__dict__,
                forward=bn.__dict__.get('forward'),
                nbt_value=None)
            self._saved.append(saved)
            if saved['has_forward']:
                inner = saved['forward']
            elif isinstance(bn, SyncBatchNorm) and (type(bn).forward is
                                                    SyncBatchNorm.forward):
                # local statistics: no collective inside forwards; the
                # ranks' statistics are combined exactly at the end
                inner = _BatchNorm.forward.__get__(bn)
            else:
                inner = type(bn).forward.__get__(bn)
            plain = (not saved['has_forward']
                     and inner.__func__ is _BatchNorm.forward)
            nbt = saved['num_batches_tracked']
            if nbt is not None:
                if plain:  # _BatchNorm.forward then skips nbt.add_(1)
                    bn._buffers['num_batches_tracked'] = None
                else:
                    saved['nbt_value'] = nbt.clone()
            bn.momentum = 1.0  # running stats := this batch's statistics
            sl = group.slices[j]
            bn._buffers['running_mean'] = group.flat[0, sl]
            bn._buffers['running_var'] = group.flat[1, sl]
            bn.__dict__['forward'] = self._make_forward(i, inner)

    def restore(self) -> None:
        for saved in reversed(self._saved):
            bn = saved['bn']
            if saved['has_forward']:
                bn.__dict__['forward'] = saved['forward']
            else:
                bn.__dict__.pop('forward', None)
            bn._buffers['running_mean'] = saved['running_mean']
            bn._buffers['running_var'] = saved['running_var']
            nbt = saved['num_batches_tracked']
            bn._buffers['num_batches_tracked'] = nbt
            if saved['nbt_value'] is not None:
                nbt.copy_(saved['nbt_value'])
            bn.momentum = saved['momentum']
        self._saved = []

    # -- per forward --------------------------------------------------------
    def _make_forward(self, i: int, inner: Callable) -> Callable:
        counts = self.counts
        flush = self._flush

        def forward(input: Tensor, *args, **kwargs):
            if counts[i]:  # second call in one forward (shared layer)
                flush(i)
            counts[i] = input.numel() // (input.shape[1]
                                          if input.dim() > 1 else 1)
            return inner(input, *args, **kwargs)

        return forward

    def _flush(self, i: int) -> None:
        """Accumulate layer ``i``'s stats of its previous call now."""
        group, j = self.layer_group[i]
        sl = group.slices[j]
        n = self.counts[i]
        stats = group.flat[:, sl].double()
        if self.population:
            w0, w1 = n, max(n - 1, 0)
            group.acc[1, sl] += n * stats[0] * stats[0]
        else:
            w0, w1 = 1, 1
        group.acc[0, sl] += w0 * stats[0]
        group.acc[1, sl] += w1 * stats[1]
        num = group.hi - group.lo
        group.weights[j] += w0
        group.weights[num + j] += w1
        self.counts[i] = 0

    def accumulate(self) -> None:
        """Fold the statistics of the last forward into the accumulators.

        Per (device, dtype) group: one host->device copy of the counts and
        five flat tensor ops; no host-device synchronisation.
        """
        counts = self.counts
        for group in self.groups:
            c = counts[group.lo:group.hi]
            if self.population:  # weights n and n - 1 (0 if not called)
                vals = c + [n - 1 if n else 0 for n in c]
            else:  # equal weight for every call
                vals = [1 if n else 0 for n in c]
                vals = vals + vals
            w = torch.tensor(vals, dtype=torch.float64)
            if group.device.type != 'cpu':
                w = w.to(group.device, non_blocking=True)
            group.weights.add_(w)
            w_chan = w[group.index].view(2, -1)
            stats = group.flat.double()
            terms = w_chan.mul_(stats)  # [n * mu, (n - 1) * var]
            group.acc.add_(terms)
            if self.population:  # + n * mu^2
                group.acc[1].addcmul_(terms[0], stats[0])
        counts[:] = self._zeros


def check_args(num_samples: Any, estimator: Any,
               owner: str = 'update_bn_stats') -> None:
    """Validate ``num_samples`` and ``estimator`` (shared with the hook).

    Args:
        num_samples (Any): Must be a positive int.
        estimator (Any): Must be one of :data:`ESTIMATORS`.
        owner (str): Named in the error message. Defaults to
            ``'update_bn_stats'``.
    """
    if (not isinstance(num_samples, int) or isinstance(num_samples, bool)
            or num_samples <= 0):
        raise ValueError(f'{owner}: num_samples must be a positive '
                         f'int (samples over all ranks, e.g. 8192), got '
                         f'{num_samples!r}')
    if estimator not in ESTIMATORS:
        raise ValueError(f'{owner}: estimator must be one of '
                         f'{ESTIMATORS}, got {estimator!r}')


@torch.no_grad()
def update_bn_stats(
        model: nn.Module,
        data_loader: Iterable,
        num_samples: int = 8192,
        estimator: str = 'population',
        forward_context: Optional[Callable[[], ContextManager]] = None,
        progress: bool = True,
        logger: Optional[Any] = None,
        group: Optional[Any] = None) -> Dict[str, Any]:
    """Recompute the running statistics of BatchNorm layers (precise BN).

    Runs forwards with frozen weights over ``num_samples`` samples and sets
    every participating BN layer's ``running_mean``/``running_var`` to the
    statistics of all the values the layer saw ("Rethinking 'Batch' in
    BatchNorm", Wu & Johnson 2021). Participating layers are the
    ``_BatchNorm`` layers (SyncBatchNorm included) in training mode that
    track running stats; layers in eval mode are left exactly alone (a user
    froze them), ``model.train()`` is never called.

    Estimators:

    - ``'population'``: per layer and channel, the mean and the biased
      variance over all values the layer normalised, each batch weighted by
      its per-channel value count ``n = numel / C``:
      ``mean = sum(n_b mu_b) / N``,
      ``var = sum((n_b - 1) v_b + n_b mu_b^2) / N - mean^2`` with ``v_b`` the
      unbiased batch variance, accumulated in float64. Independent of how
      the data is split into batches (and ranks).
    - ``'batch_average'``: equal-weight mean of the batch means and of the
      (Bessel-corrected) batch variances, as mmpretrain/pycls compute it.

    Distributed: each rank of ``group`` runs forwards on its own batches
    until it has used ``ceil(num_samples / world_size)`` samples (whole
    batches: the last one may go past it), then the float64 accumulators are
    reduced with ONE collective; every rank ends with identical statistics,
    equal to those of one process over the union of all ranks' batches.
    Model wrappers (DDP) are unwrapped and SyncBatchNorm computes local
    statistics here, so forwards issue no collectives. All ranks must have
    the same model (same BN layers in the same modes). If a forward raises
    on any rank, every rank still joins the collective, restores its state
    and raises (the failing rank its own exception, the others a
    RuntimeError): ranks never hang on each other.

    Safety: momentum, ``num_batches_tracked``, the buffer objects and the
    instance ``forward`` attribute of every layer are restored in
    ``finally``; new statistics are written in place into the original
    buffers (references and DDP stay valid) only on success, so on failure
    every BN buffer holds exactly its old values. Running stats of other
    norm layers (e.g. ``InstanceNorm(track_running_stats=True)``) are kept
    as they were. The global RNG states (python, numpy, torch CPU and CUDA)
    are restored afterwards.

    Data: for an mmengine ``BaseModel`` a batch goes through
    ``model.data_preprocessor(batch, training=False)`` (no batch
    augmentation such as mixup; the dataset pipeline's augmentation still
    applies) and ``model(**data, mode='tensor')``. For a plain module, a
    tensor batch is fed as is, a tuple/list as ``model(batch[0])`` and a
    dict as ``model(**batch)``. Samples are counted from the batches
    themselves (first dim of the input tensor or length of the input list),
    so loaders with ``batch_size=None``, uneven last batches and infinite
    samplers work. A loader shorter than needed is used entirely, with a
    warning.

    A BN layer called several times in one forward (shared layer) has each
    call accumulated as a batch of its own (exact for both estimators).

    Limitations: all ranks must hold the same BN layers (same order, modes,
    dtypes and devices), which is not checked (it would cost a collective);
    with SyncBatchNorm, ``'batch_average'`` averages per-rank batch
    statistics instead of the global-batch statistics SyncBN trains with
    (``'population'`` is unaffected: it is split-invariant). The last batch
    of each rank is used whole, so up to one batch per rank more than
    ``num_samples`` may be used (``num_samples`` in the summary is exact).

    Args:
        model (nn.Module): The model (may be wrapped in DDP/MMDDP).
        data_loader (Iterable): Yields batches; ``iter()`` is called once.
        num_samples (int): Samples to use over all ranks. Defaults to 8192.
        estimator (str): ``'population'`` or ``'batch_average'``.
            Defaults to ``'population'``.
        forward_context (Callable[[], ContextManager], optional): Called to
            get a context entered around each forward (e.g. autocast).
            Defaults to None.
        progress (bool): Show a progress bar on rank 0. Defaults to True.
        logger (str | logging.Logger, optional): Where warnings go (mmengine
            ``print_log``); None means ``'current'``. Defaults to None.
        group (ProcessGroup, optional): Process group to reduce over. None
            means the default group. Defaults to None.

    Returns:
        dict: ``num_layers`` (layers updated), ``num_samples`` and
        ``num_batches`` (used, over all ranks), ``seconds``, ``var_change``
        (mean over updated layers of ``sum|var_new - var_old| /
        sum|var_old|``, relative to this rank's old stats), ``mean_change``
        (mean over updated channels of ``|mean_new - mean_old| /
        sqrt(var_new + eps)``, in standard deviations), ``estimator``,
        ``updated``, ``skipped`` (BN layers not called in any forward: left
        alone), ``frozen`` (eval-mode BN layers: left alone) and
        ``unaffected_norms`` (GN/IN/LN/... and BN without running stats).

    Raises:
        ValueError: Bad ``num_samples``/``estimator``, or no batch at all on
            any rank (statistics are left intact).
        RuntimeError: A forward failed on another rank.
    """
    check_args(num_samples, estimator)
    start_time = time.perf_counter()
    model = _unwrap(model)
    layers, frozen, unaffected = [], [], []
    kept: List[Tuple[Tensor, Tensor]] = []  # other norms' running stats
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            if module.running_mean is None or module.running_var is None:
                unaffected.append(name)
            elif module.training:
                layers.append((name, module))
            else:
                frozen.append(name)
        elif isinstance(module, _OTHER_NORMS):
            unaffected.append(name)
            # e.g. InstanceNorm(track_running_stats=True) in training mode
            # would move its running stats in our forwards: keep them
            kept += [(buf, buf.clone()) for key, buf in module._buffers.items()
                     if buf is not None and key.startswith(('running_',
                                                            'num_batches'))]
    summary: Dict[str, Any] = dict(
        num_layers=0, num_samples=0, num_batches=0, seconds=0.0,
        var_change=0.0, mean_change=0.0, estimator=estimator, updated=[],
        skipped=[], frozen=frozen, unaffected_norms=unaffected)
    if not layers:
        return summary

    world_size, rank = get_world_size(group), get_rank(group)
    target = math.ceil(num_samples / world_size)
    log_target = logger if logger is not None else 'current'
    context = forward_context if forward_context is not None else nullcontext
    state = _PreciseBNState(layers, population=estimator == 'population')
    main = state.groups[0]
    device = main.device
    with preserve_rng_state():
        try:
            state.install()
            seen = batches = 0
            error: Optional[BaseException] = None
            bar = (ProgressBar(target, file=sys.stdout)
                   if progress and rank == 0 else None)
            try:
                iterator = iter(data_loader)
                while seen < target:
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        print_log(
                            f'update_bn_stats: the loader ran out after '
                            f'{seen} samples ({batches} batches) on rank '
                            f'{rank}; {target} were wanted on each of '
                            f'{world_size} rank(s): using what there is',
                            log_target, level=logging.WARNING)
                        break
                    with context():
                        size = _forward(model, batch, device)
                    state.accumulate()
                    seen += size
                    batches += 1
                    if bar is not None:
                        bar.update(size)
            except Exception as exc:  # all ranks must join the reduction
                error = exc
            if bar is not None:
                sys.stdout.write('\n')  # end the progress bar's line
            meta = torch.tensor([float(error is not None), seen, batches],
                                dtype=torch.float64, device=device)
            tensors = [t for g in state.groups for t in (g.acc, g.weights)]
            if world_size > 1:
                scaled_all_reduce(tensors + [meta], group=group)
                meta.mul_(world_size)
            failed, seen, batches = meta.tolist()
            if error is not None:
                raise error
            if failed > 0:
                raise RuntimeError(
                    'update_bn_stats: a forward failed on another rank (see '
                    'its log); BN statistics were left unchanged')
            if batches == 0:
                raise ValueError(
                    'update_bn_stats: no batch at all on any rank (empty or '
                    f'exhausted loader; num_samples={num_samples}, world '
                    f'size {world_size}); BN statistics were left unchanged')
            results = [_finalize(g, state.population) for g in state.groups]
        finally:
            state.restore()
            for buf, value in kept:
                buf.copy_(value)
        # commit: in place into the original buffers
        var_changes, mean_changes, skipped, updated = [], [], [], []
        for i, (name, bn) in enumerate(state.layers):
            g, j = state.layer_group[i]
            gi = state.groups.index(g)
            mean, var, called = results[gi]
            if not called[j]:
                skipped.append(name)
                continue
            sl = g.slices[j]
            old_mean = bn.running_mean.double()
            old_var = bn.running_var.double()
            new_mean, new_var = mean[sl], var[sl]
            var_changes.append((new_var - old_var).abs().sum() /
                               old_var.abs().sum().clamp_min(1e-30))
            mean_changes.append(((new_mean - old_mean).abs() /
                                 (new_var + bn.eps).sqrt()).mean())
            bn.running_mean.copy_(new_mean)
            bn.running_var.copy_(new_var)
            updated.append(name)
    if updated:
        summary['var_change'] = torch.stack(var_changes).mean().item()
        summary['mean_change'] = torch.stack(mean_changes).mean().item()
    summary.update(
        num_layers=len(updated), num_samples=int(round(seen)),
        num_batches=int(round(batches)), seconds=time.perf_counter() -
        start_time, updated=updated, skipped=skipped)
    return summary


def _finalize(g: _Group, population: bool) -> Tuple[Tensor, Tensor, list]:
    """Mean/var per channel (float64) and whether each layer was called."""
    num = g.hi - g.lo
    weight = g.weights[:num]
    chan_weight = weight[g.chan_layer]
    mean = g.acc[0] / chan_weight
    if population:
        var = (g.acc[1] / chan_weight - mean * mean).clamp_min_(0)
    else:
        var = g.acc[1] / chan_weight
    called = [w > 0 for w in weight.tolist()]
    return mean, var, called
