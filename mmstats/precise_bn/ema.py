# Copyright (c) mmstats contributors. All rights reserved.
"""The EMA copy of a model beside the model: its BN statistics exchanged
with the model's (:func:`swap_bn_statistics`, for a validation of the EMA
model) and its train/eval modes made the model's for a while
(:func:`mirror_modes`, for a recomputation of the EMA model's statistics).

Both pair the modules of two models in ``modules()`` order: the models must
have the same structure, as a deep copy (mmengine's
``ExponentialMovingAverage``) has. Neither knows about hooks or Runners.
"""
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ['swap_bn_statistics', 'mirror_modes', 'BN_STATISTICS']

#: The buffers :func:`swap_bn_statistics` exchanges (``num_batches_tracked``
#: stays: it counts training batches, the same for both models).
BN_STATISTICS = ('running_mean', 'running_var')


@torch.no_grad()
def swap_bn_statistics(a: nn.Module, b: nn.Module) -> None:
    """Exchange the running statistics of the BN layers of two models of
    the same structure, in place.

    Every BN layer of ``a`` that tracks running statistics and the layer of
    ``b`` at the same place in ``modules()`` exchange the values of their
    ``running_mean`` and ``running_var`` (:data:`BN_STATISTICS`). The
    buffer objects stay where they are (only their values move), so
    whatever holds a reference to them (an optimizer, DDP's buffer
    broadcast) sees the new values; a second call restores both models
    exactly. Parameters, modes, ``num_batches_tracked`` and other layers
    are not touched.

    Args:
        a (nn.Module): One model (e.g. the EMA copy).
        b (nn.Module): The other one, of the same structure (e.g. the
            unwrapped training model).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmstats.precise_bn import swap_bn_statistics
        >>> a, b = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
        >>> b.running_mean.fill_(3.0)
        tensor([3., 3.])
        >>> swap_bn_statistics(a, b)
        >>> a.running_mean, b.running_mean
        (tensor([3., 3.]), tensor([0., 0.]))
        >>> swap_bn_statistics(a, b)  # and back
        >>> a.running_mean
        tensor([0., 0.])
    """
    for ma, mb in zip(a.modules(), b.modules()):
        if isinstance(ma, _BatchNorm) and ma.track_running_stats:
            for name in BN_STATISTICS:
                buf_a, buf_b = getattr(ma, name), getattr(mb, name)
                kept = buf_a.clone()
                buf_a.copy_(buf_b)
                buf_b.copy_(kept)


@contextmanager
def mirror_modes(target: nn.Module, source: nn.Module) -> Iterator[None]:
    """Give every module of ``target`` the train/eval mode of the module of
    ``source`` at the same place in ``modules()``; restore ``target``'s own
    modes on exit (also when the body raises).

    Only the ``training`` flags are copied: parameters, buffers and
    ``source`` are not touched. An EMA copy made at some moment keeps the
    modes of that moment, while the model's may have changed since (a
    stage unfrozen, ``norm_eval``): recomputing the copy's statistics under
    the model's modes updates the same layers in both.

    Args:
        target (nn.Module): The model whose modes change for a while (e.g.
            the EMA copy).
        source (nn.Module): The model whose modes it takes, of the same
            structure (e.g. the unwrapped training model).

    Example:
        >>> from torch import nn
        >>> from mmstats.precise_bn import mirror_modes
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        >>> ema = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).eval()
        >>> with mirror_modes(ema, model):
        ...     [m.training for m in ema.modules()]
        [True, True, True]
        >>> [m.training for m in ema.modules()]
        [False, False, False]
    """
    modules = list(target.modules())
    own = [m.training for m in modules]
    for m, theirs in zip(modules, source.modules()):
        m.training = theirs.training
    try:
        yield
    finally:
        for m, flag in zip(modules, own):
            m.training = flag
