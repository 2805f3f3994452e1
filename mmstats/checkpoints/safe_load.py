# Copyright (c) mmstats contributors. All rights reserved.
"""Read mmengine's checkpoints under ``torch.load(weights_only=True)``.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine
0.10.7's checkpoints hold a few of its own objects (the message hub's
``HistoryBuffer``, numpy scalars and arrays, ``ConfigDict``, FSDP1's
``ShardedTensor``). This module owns the list of exactly those classes
(:func:`mmengine_checkpoint_globals`); nothing is loaded with
``weights_only=False``, which would execute arbitrary pickled code.

- :func:`load_checkpoint_file` reads one file with the list allowed for
  that call only (``torch.serialization.safe_globals``): mmstats' readers
  (the consolidation of a sharded or a whole checkpoint) work in a user's
  own script, and change nothing process-wide.
- ``mmstats.launch.allow_mmengine_checkpoints`` adds the same list to
  torch's process-wide allowlist, for the Runner's own ``torch.load``
  (``--resume``, ``load_from``): the launchers call it.

``HistoryBuffer`` pickles its statistics methods as
``getattr(HistoryBuffer, 'mean')``, and FSDP1's sharded checkpoints pickle
``getattr(ShardedTensor, 'ProcessGroupState')``. Allowlisting
``builtins.getattr`` itself would let a checkpoint reach any attribute of
any allowlisted class, so the pickle's ``getattr`` is mapped to
:func:`checkpoint_getattr`, which returns exactly those attributes.

Example:
    >>> import io, torch
    >>> from mmengine.logging import HistoryBuffer
    >>> buffer = HistoryBuffer()
    >>> buffer.update(1.5)
    >>> blob = io.BytesIO()
    >>> torch.save(dict(hub=buffer), blob)
    >>> _ = blob.seek(0)
    >>> float(load_checkpoint_file(blob)['hub'].current())
    1.5
"""
import pickle
from typing import IO, Any, Union

import numpy as np
import torch

from mmstats.utils.torch_compat import sharded_tensor_class, torch_at_least

__all__ = [
    'checkpoint_getattr', 'load_checkpoint_file', 'mmengine_checkpoint_globals'
]


def _numpy_globals() -> list:
    dtypes = [
        type(np.dtype(name))
        for name in ('float64', 'float32', 'float16', 'int64', 'int32',
                     'int16', 'int8', 'uint8', 'bool')
    ]
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    return [np.ndarray, np.dtype, _reconstruct, scalar, *dtypes]


def _getattr_allowed() -> dict:
    from mmengine.logging import HistoryBuffer
    return {
        HistoryBuffer:
        {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods},
        sharded_tensor_class(): {'ProcessGroupState'},
    }


def _sharded_tensor_globals() -> list:
    """What FSDP1's sharded state dicts pickle (``ShardedTensor`` and its
    metadata: torch has them in its private ``torch.distributed._shard``
    only)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard
    from torch.distributed._shard.sharded_tensor.metadata import (
        MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties)
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.remote_device import _remote_device
    sharded_tensor = sharded_tensor_class()
    return [
        sharded_tensor, sharded_tensor.ProcessGroupState, ShardMetadata,
        ShardedTensorMetadata, TensorProperties, MEM_FORMAT_ENCODING,
        ChunkShardingSpec, _remote_device, Shard
    ]


def checkpoint_getattr(obj: Any, name: str) -> Any:
    """``getattr`` restricted to what mmengine's checkpoints ask for:
    ``HistoryBuffer``'s statistics methods and
    ``ShardedTensor.ProcessGroupState``.

    Example:
        >>> from mmengine.logging import HistoryBuffer
        >>> checkpoint_getattr(HistoryBuffer, 'mean').__name__
        'mean'
        >>> checkpoint_getattr(HistoryBuffer, '__init__')
        Traceback (most recent call last):
        _pickle.UnpicklingError: checkpoint asks for getattr(<class \
'mmengine.logging.history_buffer.HistoryBuffer'>, '__init__'): not an \
attribute mmengine's checkpoints use
    """
    if name in _getattr_allowed().get(obj, ()):
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}): not an attribute '
        "mmengine's checkpoints use")


def mmengine_checkpoint_globals() -> list:
    """The classes and functions mmengine's checkpoints pickle, as
    ``torch.serialization``'s allowlists take them (the pickle's
    ``getattr`` as a ``(function, name)`` pair); empty before torch 2.6,
    whose ``torch.load`` defaults to ``weights_only=False``.

    Example:
        >>> from mmengine.logging import HistoryBuffer
        >>> allowed = mmengine_checkpoint_globals()
        >>> HistoryBuffer in allowed or not allowed  # empty before 2.6
        True
    """
    if not torch_at_least('2.6'):
        return []
    from mmengine.config import ConfigDict
    from mmengine.logging import HistoryBuffer
    return [
        HistoryBuffer, ConfigDict, *_numpy_globals(),
        *_sharded_tensor_globals(), (checkpoint_getattr, 'builtins.getattr'),
        (checkpoint_getattr, '__builtin__.getattr')
    ]


def load_checkpoint_file(file: Union[str, IO[bytes]]) -> Any:
    """``torch.load(file, map_location='cpu')`` with torch's default
    ``weights_only``, mmengine's classes allowed for this call only: what
    mmengine's ``_load_checkpoint`` reads, without a process-wide change.

    Example:
        .. code-block:: python

            meta = load_checkpoint_file('work_dirs/demo/epoch_2.pth')['meta']
    """
    allowed = mmengine_checkpoint_globals()
    if not allowed:
        return torch.load(file, map_location='cpu')
    with torch.serialization.safe_globals(allowed):
        return torch.load(file, map_location='cpu')
