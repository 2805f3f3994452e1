# Copyright (c) mmstats contributors. All rights reserved.
"""Let ``torch.load(weights_only=True)`` read mmengine's own checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine
0.10.7's checkpoints hold a few of its own objects (the message hub's
``HistoryBuffer``, numpy scalars and arrays, ``ConfigDict``...). We allowlist
exactly those classes instead of loading with ``weights_only=False``, which
would execute arbitrary pickled code.

``HistoryBuffer`` pickles its statistics methods as
``getattr(HistoryBuffer, 'mean')``, and FSDP1's sharded checkpoints
(``FSDPStrategy``, one file per rank) hold ``ShardedTensor`` objects, which
pickle ``getattr(ShardedTensor, 'ProcessGroupState')``. Allowlisting
``builtins.getattr`` itself would let a checkpoint reach any attribute of any
allowlisted class, so the pickle's ``getattr`` is mapped to
:func:`checkpoint_getattr`, which returns exactly those attributes.
"""
import pickle
from typing import Any

import numpy as np
import torch

from mmstats.utils.torch_compat import torch_at_least


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
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    return {
        HistoryBuffer:
        {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods},
        ShardedTensor: {'ProcessGroupState'},
    }


def _sharded_tensor_globals() -> list:
    """What FSDP1's sharded state dicts pickle (``ShardedTensor`` and its
    metadata)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (
        MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties)
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.remote_device import _remote_device
    return [
        ShardedTensor, ShardedTensor.ProcessGroupState, ShardMetadata,
        ShardedTensorMetadata, TensorProperties, MEM_FORMAT_ENCODING,
        ChunkShardingSpec, _remote_device,
        torch.distributed._shard.sharded_tensor.Shard
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


def allow_mmengine_checkpoints() -> None:
    """Allowlist the classes that mmengine's checkpoints contain.

    Idempotent. Process-wide (torch keeps one allowlist), so mmstats never
    calls it on import: ``tools/train.py`` and ``tools/test.py`` do, and
    users opt in with ``custom_imports=dict(imports=['mmstats.launch.
    allow_checkpoints'])``.

    Example:
        .. code-block:: python

            # tools/train.py, before the Runner loads a checkpoint
            from mmstats.launch import allow_mmengine_checkpoints
            allow_mmengine_checkpoints()
    """
    if not torch_at_least('2.6'):
        # torch.load's weights_only defaults to False before 2.6: nothing
        # to allow (and the allowlist takes (fn, name) pairs from 2.6 on).
        return
    from mmengine.config import ConfigDict
    from mmengine.logging import HistoryBuffer
    torch.serialization.add_safe_globals([
        HistoryBuffer, ConfigDict, *_numpy_globals(),
        *_sharded_tensor_globals(), (checkpoint_getattr, 'builtins.getattr'),
        (checkpoint_getattr, '__builtin__.getattr')
    ])
