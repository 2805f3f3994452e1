# Copyright (c) mmstats contributors. All rights reserved.
"""Which layers a recomputation touches: BN layers in training mode with
running statistics (refusing uninitialised lazy ones), the frozen ones it
leaves alone and the other norms whose running buffers it restores."""
from typing import List, Tuple

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

__all__ = ['layers_to_update', 'find_layers']

_OTHER_NORMS = tuple(
    norm for norm in (nn.GroupNorm, _InstanceNorm, nn.LayerNorm,
                      nn.LocalResponseNorm, getattr(nn, 'RMSNorm', None))
    if norm is not None)


def _check_initialised(name: str, module: nn.Module) -> None:
    """Refuse a lazy BN layer (e.g. ``nn.LazyBatchNorm2d``) whose buffers
    are not materialised yet, naming it and the fix."""
    if (isinstance(module, nn.modules.lazy.LazyModuleMixin)
            and module.has_uninitialized_params()):
        raise ValueError(
            f'update_bn_stats: BN layer {name or "<model>"!r} '
            f'({type(module).__name__}) is not initialised yet (a lazy '
            'module gets its number of channels at its first forward); run '
            'one forward of the model first (e.g. on one batch, under '
            'torch.no_grad()), or build it with num_features, e.g. '
            'nn.BatchNorm2d(C)')


def layers_to_update(model: nn.Module, train: bool = False) -> List[str]:
    """Names of the BN layers :func:`update_bn_stats` would recompute: in
    training mode, with running statistics.

    Args:
        model (nn.Module): The model (may be wrapped).
        train (bool): Judge the modes ``model.train()`` gives (it honours
            overrides such as ``norm_eval`` and frozen stages); every
            module's mode is restored afterwards. Defaults to False: the
            modes of now.

    Returns:
        list[str]: The layers' module names.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
        ...                       nn.BatchNorm2d(4).eval())
        >>> layers_to_update(model)
        ['1']
    """
    modules = list(model.modules())
    flags = [m.training for m in modules]
    try:
        if train:
            model.train()
        return [
            name for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.training
            and m.running_mean is not None and m.running_var is not None
        ]
    finally:
        for module, flag in zip(modules, flags):
            module.training = flag


def find_layers(model: nn.Module) -> Tuple[list, list, list, list]:
    """(participating BN layers with names, frozen names, unaffected names,
    other norms' running buffers with a copy to restore).

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm1d(2).eval(),
        ...                       nn.LayerNorm(2))
        >>> layers, frozen, unaffected, kept = find_layers(model)
        >>> [name for name, _ in layers], frozen, unaffected, kept
        (['0'], ['1'], ['2'], [])
    """
    layers, frozen, unaffected, kept = [], [], [], []
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            if module.running_mean is None or module.running_var is None:
                unaffected.append(name)
            elif module.training:
                _check_initialised(name, module)
                layers.append((name, module))
            else:
                frozen.append(name)
        elif isinstance(module, _OTHER_NORMS):
            unaffected.append(name)
            # e.g. InstanceNorm(track_running_stats=True) in training mode
            kept += [(buf, buf.clone())
                     for key, buf in module._buffers.items()
                     if buf is not None and key.startswith(('running_',
                                                            'num_batches'))]
    return layers, frozen, unaffected, kept
