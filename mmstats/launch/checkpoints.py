# Copyright (c) mmstats contributors. All rights reserved.
"""Let the Runner's own ``torch.load(weights_only=True)`` read mmengine's
checkpoints (``--resume``, ``load_from``): torch's process-wide allowlist
gets exactly the classes they hold, the list
:mod:`mmstats.checkpoints.safe_load` owns (mmstats' own readers allow it
per call instead).
"""
import torch

from mmstats.checkpoints.safe_load import (checkpoint_getattr,
                                           mmengine_checkpoint_globals)

__all__ = ['allow_mmengine_checkpoints', 'checkpoint_getattr']


def allow_mmengine_checkpoints() -> None:
    """Allowlist the classes that mmengine's checkpoints contain.

    Idempotent. Process-wide (torch keeps one allowlist), so mmstats never
    calls it on import: ``tools/train.py`` and ``tools/test.py`` do, and
    users opt in with ``custom_imports=dict(imports=['mmstats.launch.
    allow_checkpoints'])``. Before torch 2.6 ``torch.load`` defaults to
    ``weights_only=False``: nothing to allow.

    Example:
        .. code-block:: python

            # tools/train.py, before the Runner loads a checkpoint
            from mmstats.launch import allow_mmengine_checkpoints
            allow_mmengine_checkpoints()
    """
    allowed = mmengine_checkpoint_globals()
    if allowed:
        torch.serialization.add_safe_globals(allowed)
