# Copyright (c) mmstats contributors. All rights reserved.
"""mmengine strategies whose checkpoints hold every rank's shard, resume and
evaluate (``docs/checkpoints.md``): ``type='mmstats.FSDP2Strategy'``,
``'mmstats.FSDPStrategy'``, ``'mmstats.DeepSpeedStrategy'``.

The strategies load on first use (``mmstats.registry.STRATEGIES`` imports
their modules): importing :mod:`mmstats.strategies.consolidate` to read a
checkpoint imports neither mmengine's strategies nor DeepSpeed.
"""
from mmstats.utils.lazy import lazy_getattr
from .consolidate import (SCHEME, consolidate_checkpoint,
                          is_checkpoint_directory, is_deepspeed_checkpoint,
                          is_sharded_checkpoint, read_deepspeed_checkpoint,
                          read_full_checkpoint, register_consolidating_loader)

_LAZY = {
    'DeepSpeedStrategy': '.deepspeed',
    'FSDPStrategy': '.fsdp',
    'FSDP2Strategy': '.fsdp2',
    'ShardedCheckpointing': '.state_dicts',
    'refuse_partial_tensors': '.state_dicts',
}

__all__ = [
    'DeepSpeedStrategy', 'FSDPStrategy', 'FSDP2Strategy',
    'ShardedCheckpointing', 'refuse_partial_tensors', 'SCHEME',
    'consolidate_checkpoint', 'is_checkpoint_directory',
    'is_deepspeed_checkpoint', 'is_sharded_checkpoint',
    'read_deepspeed_checkpoint', 'read_full_checkpoint',
    'register_consolidating_loader'
]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
