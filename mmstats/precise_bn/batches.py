# Copyright (c) mmstats contributors. All rights reserved.
"""Feeding one batch to a model and counting its samples."""
from typing import Any, Optional, Tuple

import torch
from mmengine.model import BaseModel
from torch import Tensor, nn

__all__ = ['count_samples', 'prepare_batch']


def count_samples(inputs: Any) -> int:
    """Samples in a batch: first dim of a tensor or length of a list.

    Example:
        >>> import torch
        >>> count_samples(torch.zeros(8, 3)), count_samples([1, 2, 3])
        (8, 3)
        >>> count_samples({'inputs': torch.zeros(5, 2), 'labels': [0]})
        5
    """
    if isinstance(inputs, Tensor):
        return int(inputs.shape[0]) if inputs.dim() > 0 else 1
    if isinstance(inputs, (list, tuple)):
        return len(inputs)
    if isinstance(inputs, dict) and inputs:
        return count_samples(inputs.get('inputs', next(iter(inputs.values()))))
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


def prepare_batch(model: nn.Module, batch: Any,
                  device: Optional[torch.device]) -> Tuple[tuple, dict, int]:
    """The arguments of one forward of ``model`` on ``batch``, and the
    batch's number of samples.

    An mmengine ``BaseModel`` gets ``model.data_preprocessor(batch, False)``
    and ``mode='tensor'``; a plain module gets a tensor batch as is,
    ``batch[0]`` of a tuple/list and a dict as keyword arguments (moved to
    ``device`` first).

    Returns:
        tuple: ``(args, kwargs, samples)``; the forward is
        ``model(*args, **kwargs)`` (called through the wrapper that shards
        ``model``, if any).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> args, kwargs, samples = prepare_batch(
        ...     nn.Linear(3, 2), (torch.zeros(4, 3), torch.zeros(4)), None)
        >>> args[0].shape, kwargs, samples
        (torch.Size([4, 3]), {}, 4)
    """
    if isinstance(model, BaseModel):
        data = model.data_preprocessor(batch, False)
        if isinstance(data, dict):
            return (), dict(
                data, mode='tensor'), count_samples(
                    data['inputs'] if 'inputs' in data else data)
        if isinstance(data, (list, tuple)):
            return tuple(data), dict(mode='tensor'), count_samples(data[0])
        raise TypeError('update_bn_stats: the data_preprocessor returned a '
                        f'{type(data).__name__}; expected a dict or tuple')
    if device is not None and device.type != 'cpu':
        batch = _to_device(batch, device)
    if isinstance(batch, Tensor):
        return (batch, ), {}, count_samples(batch)
    if isinstance(batch, (list, tuple)) and batch:
        return (batch[0], ), {}, count_samples(batch[0])
    if isinstance(batch, dict):
        return (), dict(batch), count_samples(batch)
    raise TypeError('update_bn_stats: a batch for a plain nn.Module must be '
                    'a tensor, a non-empty tuple/list (the first item is fed '
                    f'to the model) or a dict of kwargs; got '
                    f'{type(batch).__name__}')
