# Copyright (c) mmstats contributors. All rights reserved.
"""FSDP2Strategy: torch's ``fully_shard`` under a FlexibleRunner, with
checkpoints of the whole model."""
from typing import Any, Optional

from mmengine._strategy import DDPStrategy
from mmengine.device import get_device
from mmengine.registry import MODEL_WRAPPERS
from torch import nn

from mmstats.registry import STRATEGIES
from mmstats.utils.torch_compat import require_cpu_fully_shard, require_torch
from .state_dicts import ShardedCheckpointing, checkpoint_format

__all__ = ['FSDP2Strategy']


@STRATEGIES.register_module()
class FSDP2Strategy(ShardedCheckpointing, DDPStrategy):
    """FSDP2 (torch's ``fully_shard``) for a ``FlexibleRunner``.

    mmengine 0.10.7 has no FSDP2 strategy. This one shards the model with
    ``model_wrapper`` (:class:`mmstats.FullyShard` by default, the only
    wrapper it accepts) and saves checkpoints that hold every rank's shard
    (``docs/checkpoints.md``): mmengine's ``DDPStrategy`` would pickle
    rank 0's shards as the whole model.

    Args:
        model_wrapper (dict, optional): :class:`mmstats.FullyShard`'s
            arguments (``blocks``, ``param_dtype``...). Defaults to
            ``dict(type='mmstats.FullyShard')``.
        state_dict_cfg (str): ``'full'``: one ordinary checkpoint file of
            full tensors, gathered on rank 0 (any runner loads it);
            ``'sharded'``: a ``torch.distributed.checkpoint`` directory of
            every rank's shards (no gather; any number of processes loads
            it); mmengine's name ``'local'`` is taken for ``'sharded'``.
            Defaults to ``'full'``.
        **kwargs: mmengine's ``DDPStrategy`` arguments.

    Example:
        >>> strategy = dict(
        ...     type='mmstats.FSDP2Strategy',
        ...     model_wrapper=dict(blocks=r'backbone\\.layer\\d'))
        >>> STRATEGIES.get('FSDP2Strategy') is FSDP2Strategy
        True
    """

    def __init__(self,
                 *,
                 model_wrapper: Optional[dict] = None,
                 state_dict_cfg: str = 'full',
                 **kwargs: Any) -> None:
        require_torch('2.4', 'mmstats.FSDP2Strategy (fully_shard)')
        require_cpu_fully_shard('mmstats.FSDP2Strategy (fully_shard)')
        fmt = checkpoint_format('FSDP2Strategy', state_dict_cfg)
        wrapper = dict(type='mmstats.FullyShard')
        wrapper.update(model_wrapper or {})
        super().__init__(model_wrapper=wrapper, **kwargs)
        self.checkpoint_format = fmt

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        """Shard ``model`` in place with the model wrapper."""
        model = self.convert_model(model.to(get_device()))
        return MODEL_WRAPPERS.build(
            self.model_wrapper,
            default_args=dict(module=model, strategy='FSDP2Strategy'))
