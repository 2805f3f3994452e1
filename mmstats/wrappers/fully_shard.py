# Copyright (c) mmstats contributors. All rights reserved.
"""FullyShard: torch's FSDP2 (``fully_shard``) from a config.

mmengine 0.10.7 has no FSDP2 strategy; :class:`mmstats.FSDP2Strategy`
builds this entry of the ``MODEL_WRAPPERS`` registry, which shards the model
in place and returns it. It is a class (building it returns the sharded
module, not an instance) because mmengine's ``is_model_wrapper`` calls
``isinstance`` with every registered entry.

Only ``FSDP2Strategy`` may build it: under mmengine's ``DDPStrategy`` (which
builds any ``model_wrapper``) the checkpoints would hold rank 0's shard of
every weight as if it were the whole weight.
"""

from typing import Any, Optional

import torch
from torch import nn

from mmstats.registry import MODEL_WRAPPERS
from mmstats.utils.args import check_positive_int, check_str, compile_regex
from mmstats.utils.torch_compat import fully_shard_api

__all__ = ['FullyShard']


def _dtype(owner: str, name: str, value: Optional[str]) -> Any:
    if value is None:
        return None
    check_str(owner, name, value, 'bfloat16')
    dtype = getattr(torch, value, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{owner}: {name} must name a floating torch dtype "
                         f"(e.g. {name}='bfloat16'), got {value!r}")
    return dtype


def _hsdp_mesh(owner: str, module: nn.Module, replicas: int) -> Any:
    """A 2-D ``('replicate', 'shard')`` device mesh: HSDP."""
    from mmengine.dist import get_world_size
    from torch.distributed.device_mesh import init_device_mesh
    world = get_world_size()
    if world % replicas:
        raise ValueError(f'{owner}: replicas={replicas} must divide the '
                         f'world size {world}')
    device = next(module.parameters()).device.type
    return init_device_mesh(
        device, (replicas, world // replicas),
        mesh_dim_names=('replicate', 'shard'))


@MODEL_WRAPPERS.register_module()
class FullyShard:
    """Shard a model with FSDP2: ``fully_shard`` on every module whose name
    matches ``blocks`` (inner ones first), then on the root.

    Building it (``MODEL_WRAPPERS.build``, as ``DDPStrategy`` does) returns
    the model itself, sharded in place: its parameters become DTensors.
    mmstats' hooks read them as the full tensors (``docs/sharding.md``).

    Args:
        module (nn.Module): The model (given by the strategy).
        blocks (str): Regular expression matched (``re.fullmatch``) against
            ``named_modules()`` names, e.g. ``r'backbone\\.layer\\d'``.
        param_dtype (str, optional): Compute dtype of the parameters
            (``MixedPrecisionPolicy``), e.g. ``'bfloat16'``. Defaults to
            None (the parameters' own).
        reduce_dtype (str, optional): Dtype of the gradient reduction.
            Defaults to None (``param_dtype``).
        fp32_modules (str, optional): Regular expression of modules kept
            in float32 under ``param_dtype`` (their own units, inputs cast),
            e.g. ``'.*bn.*'`` for CPU BatchNorm, which takes one dtype.
            Defaults to None.
        replicas (int): HSDP: shard over ``world_size / replicas`` ranks
            and replicate over ``replicas`` groups of them (a 2-D device
            mesh). Defaults to 1 (FSDP over every rank).
        strategy (str, optional): The strategy building it, set by
            ``FSDP2Strategy``; any other is refused. Defaults to None.
        **strategy_args: What a strategy adds for DDP (``device_ids``...);
            ignored.

    Example:
        >>> strategy = dict(
        ...     type='mmstats.FSDP2Strategy',
        ...     model_wrapper=dict(type='mmstats.FullyShard',
        ...                        blocks=r'backbone\\.layer\\d'))
        >>> FullyShard.__name__
        'FullyShard'
    """

    def __new__(cls,
                module: nn.Module,
                blocks: str,
                param_dtype: Optional[str] = None,
                reduce_dtype: Optional[str] = None,
                fp32_modules: Optional[str] = None,
                replicas: int = 1,
                strategy: Optional[str] = None,
                **strategy_args: Any) -> nn.Module:
        owner = 'FullyShard'
        if strategy != 'FSDP2Strategy':
            raise ValueError(
                f"{owner}: build it with strategy=dict(type='mmstats."
                "FSDP2Strategy', model_wrapper=dict(blocks=...)) "
                "(configs/_base_/strategies/fsdp2.py): under mmengine's "
                'DDPStrategy the checkpoints would hold rank 0\'s shard of '
                'every weight as the whole weight')
        fully_shard, MixedPrecisionPolicy = fully_shard_api()
        pattern = compile_regex(owner, 'blocks', blocks)
        keep = None if fp32_modules is None else compile_regex(
            owner, 'fp32_modules', fp32_modules)
        kwargs = {}
        if check_positive_int(owner, 'replicas', replicas, example=2) > 1:
            kwargs['mesh'] = _hsdp_mesh(owner, module, replicas)
        if param_dtype is not None or reduce_dtype is not None:
            kwargs['mp_policy'] = MixedPrecisionPolicy(
                param_dtype=_dtype(owner, 'param_dtype', param_dtype),
                reduce_dtype=_dtype(owner, 'reduce_dtype', reduce_dtype))
        named = [(n, m) for n, m in module.named_modules() if n]
        if keep is not None:
            fp32 = MixedPrecisionPolicy(
                param_dtype=torch.float32, cast_forward_inputs=True)
            for _, sub in reversed([(n, m) for n, m in named
                                    if keep.fullmatch(n)]):
                fully_shard(
                    sub,
                    mp_policy=fp32,
                    **{
                        k: v
                        for k, v in kwargs.items() if k == 'mesh'
                    })
        matched = [m for n, m in named if pattern.fullmatch(n)]
        if not matched:
            raise ValueError(
                f'{owner}: blocks={blocks!r} matches no module name of '
                f'{type(module).__name__} (re.fullmatch)')
        for sub in reversed(matched):  # inner units before outer ones
            fully_shard(sub, **kwargs)
        fully_shard(module, **kwargs)
        return module
