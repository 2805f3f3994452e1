# Copyright (c) mmstats contributors. All rights reserved.
"""FSDPStrategy: mmengine's FSDP1 strategy with checkpoints that resume."""
from typing import Any

from mmengine._strategy import FSDPStrategy as MMEngineFSDPStrategy

from mmstats.registry import STRATEGIES
from mmstats.utils.torch_compat import require_torch
from .state_dicts import ShardedCheckpointing, checkpoint_format

__all__ = ['FSDPStrategy']


@STRATEGIES.register_module()
class FSDPStrategy(ShardedCheckpointing, MMEngineFSDPStrategy):
    """mmengine's ``FSDPStrategy`` (torch FSDP1) whose checkpoints hold
    every rank's shard and resume (``docs/checkpoints.md``).

    mmengine 0.10.7's own strategy cannot resume (it calls
    ``FSDP.optim_state_dict_to_load`` with torch < 2.1's argument order),
    and its ``'local'`` checkpoints are one pickle of flat shards per rank
    that only the same number of processes can read. This one saves and
    loads through ``torch.distributed.checkpoint.state_dict``:

    - ``state_dict_cfg='full'``: one ordinary checkpoint file of full
      tensors, written by rank 0 (DDP's format; any runner loads it);
    - ``state_dict_cfg='sharded'``, or mmengine's names of it: ``'local'``
      (mmengine's default; there per-rank pickles of flat shards) or a
      dict with ``state_dict_type='SHARDED_STATE_DICT'``: a sharded
      directory,
      ``torch.distributed.checkpoint`` files of every rank's shards, that
      any number of processes loads and ``tools/model_converters/
      consolidate_checkpoint.py`` turns into a full file.

    Every other argument is mmengine's ``FSDPStrategy``'s.

    Example:
        >>> strategy = dict(
        ...     type='mmstats.FSDPStrategy', state_dict_cfg='full',
        ...     model_wrapper=dict(type='MMFullyShardedDataParallel',
        ...                        use_orig_params=True))
        >>> STRATEGIES.get('FSDPStrategy') is FSDPStrategy
        True
    """

    def __init__(self,
                 *,
                 state_dict_cfg: Any = 'local',
                 **kwargs: Any) -> None:
        require_torch(
            '2.2', 'mmstats.FSDPStrategy (torch.distributed.checkpoint.'
            "state_dict; mmengine's own FSDPStrategy trains there, without "
            'resume)')
        fmt = checkpoint_format('FSDPStrategy', state_dict_cfg)
        if state_dict_cfg == 'sharded':  # mmengine's name of it
            state_dict_cfg = 'local'
        super().__init__(state_dict_cfg=state_dict_cfg, **kwargs)
        self.checkpoint_format = fmt
