# Copyright (c) mmstats contributors. All rights reserved.
"""Let ``torch.load(weights_only=True)`` read mmengine's own checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine
0.10.7's checkpoints hold a few of its own objects (the message hub's
``HistoryBuffer``, numpy scalars and arrays, ``ConfigDict``...). We allowlist
exactly those classes instead of loading with ``weights_only=False``, which
would execute arbitrary pickled code.

``HistoryBuffer`` pickles its statistics methods as
``getattr(HistoryBuffer, 'mean')``. Allowlisting ``builtins.getattr`` itself
would let a checkpoint reach any attribute of any allowlisted class, so the
pickle's ``getattr`` is mapped to :func:`history_buffer_getattr`, which only
returns HistoryBuffer's registered statistics methods.
"""
import pickle
from typing import Any

import numpy as np
import torch


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


def history_buffer_getattr(obj: Any, name: str) -> Any:
    """``getattr`` restricted to ``HistoryBuffer``'s statistics methods.

    Example:
        >>> from mmengine.logging import HistoryBuffer
        >>> history_buffer_getattr(HistoryBuffer, 'mean').__name__
        'mean'
        >>> history_buffer_getattr(HistoryBuffer, '__init__')
        Traceback (most recent call last):
        _pickle.UnpicklingError: checkpoint asks for getattr(<class \
'mmengine.logging.history_buffer.HistoryBuffer'>, '__init__'): only \
HistoryBuffer statistics methods are allowed
    """
    from mmengine.logging import HistoryBuffer
    allowed = {
        'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods
    }
    if obj is HistoryBuffer and name in allowed:
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}): only '
        'HistoryBuffer statistics methods are allowed')


def allow_mmengine_checkpoints() -> None:
    """Allowlist the classes that mmengine's checkpoints contain.

    Idempotent. Process-wide (torch keeps one allowlist), so mmstats never
    calls it on import: ``tools/train.py`` and ``tools/test.py`` do, and
    users opt in with ``custom_imports=dict(imports=['mmstats.utils.
    allow_checkpoints'])``.

    Example:
        .. code-block:: python

            # tools/train.py, before the Runner loads a checkpoint
            from mmstats.utils import allow_mmengine_checkpoints
            allow_mmengine_checkpoints()
    """
    from mmengine.config import ConfigDict
    from mmengine.logging import HistoryBuffer
    torch.serialization.add_safe_globals([
        HistoryBuffer, ConfigDict, *_numpy_globals(),
        (history_buffer_getattr, 'builtins.getattr'),
        (history_buffer_getattr, '__builtin__.getattr')
    ])
