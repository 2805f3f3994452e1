# Copyright (c) mmstats contributors. All rights reserved.
"""mmengine strategies whose checkpoints hold every rank's shard, resume and
evaluate (``docs/checkpoints.md``): ``type='mmstats.FSDP2Strategy'``,
``'mmstats.FSDPStrategy'``, ``'mmstats.DeepSpeedStrategy'``."""
from .consolidate import (SCHEME, is_checkpoint_directory,
                          read_full_checkpoint, register_consolidating_loader)
from .deepspeed import (DeepSpeedStrategy, is_deepspeed_checkpoint,
                        read_deepspeed_checkpoint)
from .fsdp import FSDPStrategy
from .fsdp2 import FSDP2Strategy
from .state_dicts import (consolidate_checkpoint, is_sharded_checkpoint,
                          refuse_partial_tensors)

__all__ = [
    'DeepSpeedStrategy', 'FSDPStrategy', 'FSDP2Strategy',
    'consolidate_checkpoint', 'is_sharded_checkpoint',
    'is_deepspeed_checkpoint', 'read_deepspeed_checkpoint',
    'refuse_partial_tensors', 'SCHEME', 'is_checkpoint_directory',
    'read_full_checkpoint', 'register_consolidating_loader'
]
